"""AutoSelect demonstration selection (issue 21, item 3): accuracy vs number of
demonstrations for random, nearest-neighbour, best-of-k and the trained policy."""
