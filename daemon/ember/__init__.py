"""ember: an eBPF continuous profiler (on-CPU and off-CPU)."""

__version__ = "0.1.0"
