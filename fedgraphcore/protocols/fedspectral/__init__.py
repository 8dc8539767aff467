"""FedSpectral and FedSpectral+ (Thakkar & Joshi): spectral clustering over
edge-partitioned graphs. Plain numpy/scipy, no Flower.

Setting: every client knows all ``N`` node ids and holds some of the edges
of one global graph, ``A_c`` (N x N, 0/1, global indexing). An edge may be held
by ``r`` clients; the partition protocol tells each client ``r`` per edge
(``Shard.edge_weight``), so ``sum_c A_c / r = A`` exactly.

The modules:

* :mod:`.wire` - the steps, what a valid reply holds, the typed config views
  of ``fedspectral`` and ``fedspectral-plus``;
* :mod:`.baseline` - FedSpectral (paper Algorithms 1-2): local spectral
  labels and the server's co-association clustering;
* :mod:`.plus` - FedSpectral+: the clients' operators (paper mode's local
  normalised adjacency, exact mode's ``A_c / r`` and degree shares), the
  paper's aggregation, the final embedding's labels, and the bounds and edge
  sensitivities the secure sums and the DP noise are set by;
* :mod:`.block_iteration` - the server's eigensolvers, which touch the
  operator only through products ``M X`` (one federated round each).
"""
