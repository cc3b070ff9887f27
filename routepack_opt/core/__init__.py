"""The core layer: the window, the topology, the cost model, the objectives, layouts and plans,
the one evaluator, the lower bounds, and atomic file output. It imports nothing else from the
package; every other layer builds on it."""
