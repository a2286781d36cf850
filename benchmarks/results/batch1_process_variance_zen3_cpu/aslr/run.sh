#!/bin/bash
for i in 1 2 3 4 5 6; do
  python benchmarks/results/batch1_process_variance_zen3_cpu/aslr/b1proc.py "aslr-on-$i" 400
  setarch -R python benchmarks/results/batch1_process_variance_zen3_cpu/aslr/b1proc.py "aslr-off-$i" 400
done
