"""STile: dynamic sparsity known at call time. The online index of live micro-tiles
(tile_index), kernels over them (dynamic), gathered dense compute tiles (kernels,
gathered), and the choice of tile (choice)."""
