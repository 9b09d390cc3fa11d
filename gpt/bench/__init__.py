"""Benchmarks the project runs on itself (scripts/bench_*.py are their entry points)."""
