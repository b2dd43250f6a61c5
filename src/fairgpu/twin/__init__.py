"""The digital twin: what a driver saw, recorded as a versioned JSON-lines trace that the simulator replays.

Driver-neutral (the engine, `spec` and `model` only): the controller and `fairgpu record` write traces
through it, the simulator reads them (sim/traces.py), and neither driver imports the other.
"""
