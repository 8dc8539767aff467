"""Server side of each clustering method: one ClusteringStrategy per module."""
