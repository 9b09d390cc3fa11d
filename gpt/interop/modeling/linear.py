"""Linear attention's layer in a remote-code export (gpt/designs/linear.py): phi(q).phi(k) weights over the earlier
keys, phi(x) = elu(x) + 1, normalised by their sum; no softmax."""

import torch.nn.functional as F

EPS = 1e-6


class Part:
    def attend(self, layer, q, k, v, ctx):
        """q (B, nh, T, D), k, v (B, nkv, T, D) -> (B, nh, T, D)."""
        group = q.size(1) // k.size(1)
        fq, fk = F.elu(q) + 1.0, F.elu(k) + 1.0
        if ctx.key_mask is not None:
            fk = fk * ctx.key_mask[:, None, :, None].to(fk.dtype)  # padding keys weigh nothing
        weights = (fq @ fk.repeat_interleave(group, dim=1).transpose(-2, -1)).tril()  # (B, nh, T, T)
        numerator = weights @ v.repeat_interleave(group, dim=1)
        return numerator / (weights.sum(-1).unsqueeze(-1) + EPS)
