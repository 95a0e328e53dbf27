"""Runs and campaigns of runs: one run as named steps (run), a load sweep, deployment candidates, repeats, and
the early stop that ends a point once running on cannot change its verdict."""
