"""`bench plan`: a scenario's load replayed on a simulated deployment instead of a real one.

The native engine's own Scheduler, BlockManager (hash and radix prefix caches) and router Policy
run on a virtual clock (simulator.py); how long each engine step takes comes from a step model
(step_model.py: fitted to measured runs; planroof's roofline_model.py from a GPU's datasheet).
The result is a results folder in `bench run`'s format, marked `simulated: true`. docs/planner.md.
"""
