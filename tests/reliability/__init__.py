"""The reliability suite: kills, chaos, a full disk, bad inputs, fuzzed responses and secrets (issue 7)."""
