#!/bin/bash
# ResNet-18 CIFAR batch-1 inference, NHWC fp32, six bench processes one after the other
# (an empty autotune cache before each): PyTorch eager beside the defaults in every run,
# torch.compile rows in runs 2, 4, 5 and 6 (the same command four times), plain-XLA rows in 3.
base="--model resnet18 --stem cifar --image-size 32 --layouts NHWC --precisions fp32 --batch-sizes 1 --modes infer --torch"
extras=("" "--torch-compile" "--baseline-plain" "--torch-compile" "--torch-compile" "--torch-compile")
for i in 1 2 3 4 5 6; do
  rm -rf ~/.cache/layoutlab
  layoutlab bench $base ${extras[$((i-1))]} --out run$i
done
