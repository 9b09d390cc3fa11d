"""What copying is worth in a prepared data set (docs/interpret.md): how often the simplest induction rule (the token
after the most recent earlier occurrence of the current token) is right about the next token in 300 random
validation windows of T tokens, and how often it is right where a bigram table (the training split's most frequent
successor of the current token) is wrong. python benchmarks/copy_rule.py data/<name> T [T ...]"""
import sys

import numpy as np

folder = sys.argv[1]
train = np.fromfile(f"{folder}/train_000000.bin", dtype=np.uint16).astype(np.int64)
v = np.fromfile(f"{folder}/val_000000.bin", dtype=np.uint16)
n = int(max(train.max(), v.max())) + 1
counts = np.bincount(train[:-1] * n + train[1:], minlength=n * n).reshape(n, n)
bigram = counts.argmax(1)
for T in map(int, sys.argv[2:]):
    rng = np.random.default_rng(0)
    hits = extra = big = tot = 0
    for s in rng.integers(0, len(v) - T - 1, 300):
        w = v[s:s + T + 1]
        last = {}
        for t in range(T):
            tok = int(w[t])
            right = bigram[tok] == w[t + 1]
            big += right
            if tok in last and w[last[tok] + 1] == w[t + 1]:
                hits += 1
                extra += not right
            last[tok] = t
            tot += 1
    print(f"{folder} T={T}: bigram table right on {big / tot:.1%} of tokens; copy rule right on {hits / tot:.1%}, "
          f"{extra / tot:.1%} where the bigram table is wrong")
