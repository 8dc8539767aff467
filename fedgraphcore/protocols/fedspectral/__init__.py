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

``fedspectral`` (baseline) wire protocol
    1. ``fedspectral_local`` (down: k, seed) -> up: ``labels`` (N int64), the
       client's spectral clustering of its own graph. Labels of all nodes leave
       the client (a coarse summary of its edges), no edge or degree does.
    The server clusters the co-association graph of the C labelings (never N x N).

``fedspectral-plus`` wire protocol
    ``mode=paper`` (Algorithms 3-4): ``fedspectral-plus.rounds`` x
    ``fedspectral_power`` (down: the N x K block V, scaled to max |entry| 1)
    -> up: ``block`` = ``M_c^iters V`` (N x K). The server averages and QRs.

    ``mode=exact`` (beyond the paper): once ``fedspectral_degrees`` -> up:
    ``degrees`` = the client's share ``A_c 1 / r`` of every node's degree,
    pairwise masked whenever there are two or more clients, so the server
    learns only the global degree vector ``d`` (an aggregate over clients,
    recorded in the ledger; with one client, its own degrees). Then per
    round ``fedspectral_product`` (down: ``Y = D^-1/2 X`` scaled, N x b) -> up:
    ``block`` = ``(A_c / r) Y`` (N x b). The server's ``D^-1/2 sum_c`` is the
    global operator applied to X. ``solver=krylov`` (``auto`` without noise):
    block Lanczos with Rayleigh-Ritz, each round multiplying the newest block
    of a growing Krylov basis, until every top-k Ritz pair's residual
    ``||M u - theta u||`` (computed from the products) is at most ``tol``;
    ``solver=chebyshev`` (``auto`` with noise): Chebyshev-filtered orthogonal
    iteration, until the top-k subspace stops moving. Either way each round is
    one sum of client products of a block the server chose, nothing else.

    Last step (both modes): ``labels`` (down: the final labels) -> up: a count.

What the server can infer. A plain (unmasked) block is a linear image of the
client's edges: for a random V a node with a single local edge has a row equal
to its neighbour's row of V (scaled), so plain blocks reveal edges to the
server; over N/K rounds they determine ``A_c`` (or ``M_c``). A node with no
local edge has an all-zero row, so plain blocks also say which nodes a
client has no edge for. With
``fedspectral-plus.secure`` every block is pairwise masked (secagg ring) and the
server sees only the sum over clients, i.e. which client holds which edge is
hidden; the sums themselves are still a linear image of the *global* graph.
``fedspectral-plus.noise-multiplier > 0`` adds Gaussian noise on every client
(each upload carries the full noise, so the guarantee does not rely on secure
aggregation), calibrated to the L2 sensitivity of one edge (added or removed
at every client holding it), and accounted with Opacus' RDP accountant over
all releases: edge-level (epsilon, delta)-DP for the whole run. A noised
request sent again after a timeout (``retries``) gets the first draw back, so
it is no extra release. A plain block with an entry above the largest an
honest one can hold (plus 12 noise std) stops the run, naming the client.
"""
