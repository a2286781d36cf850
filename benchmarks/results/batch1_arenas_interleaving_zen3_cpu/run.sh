#!/bin/bash
# ResNet-18 CIFAR batch-1 inference: the bench's interleaved rows and its per-thread arenas,
# in the order A B C C B A (an empty autotune cache before each run).
base="--model resnet18 --stem cifar --image-size 32 --layouts NHWC,NCHW --precisions fp32 --batch-sizes 1 --modes infer --torch"
i=0
for v in A B C C B A; do
  i=$((i+1))
  case $v in
    A) extra="--torch-compile --baseline-plain";;                         # the flags
    B) extra="--torch-compile --baseline-plain --no-keep-host-memory";;   # glibc's malloc
    C) extra="";;                                                         # PyTorch eager only
  esac
  rm -rf ~/.cache/layoutlab
  layoutlab bench $base $extra --out run${i}_$v
done
