"""Benchmark scenarios: contenders measured side by side in one run, alternating."""
