"""Client side of each clustering method: one ClusteringClient per module."""
