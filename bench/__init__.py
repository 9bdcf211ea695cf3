"""zoo's benchmark harness: runtimes, the timing loop, statistics, environment, results."""
