"""What the records say: latencies and throughput over the steady window, their confidence intervals, the
phases, roofline and diagnosis that explain them, the validity verdict, output agreement, capacity under SLOs."""
