"""The simulator: a discrete-event driver for the engine, scenario files, trace loaders and metrics."""
