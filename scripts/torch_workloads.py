"""W1..W8 (examples/w*.dl) written in PyTorch, once: the peers of
bench_train.py (a training step on the CPU, W2, W6 and W7 from here) and
gpu_peers.py (the GPU check, every workload) call these. Same shapes and
computation as the .dl files; the element-wise pieces (the tanh gelu,
layernorm without affine, eps 1e-5) as the workloads write them.
"""
import math


def models(torch, layernorm=None):
    """The workloads by entry name (gemm, mlp, conv_block, attention,
    layernorm_gelu, bert_layer, gru, gcn). `layernorm` replaces the explicit
    mean-and-variance form (gpu_peers.py passes torch's fused one)."""
    F = torch.nn.functional

    def gelu(z):
        return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))

    def explicit_layernorm(z):
        m = z.mean(-1, keepdim=True)
        v = ((z - m) ** 2).mean(-1, keepdim=True)
        return (z - m) / torch.sqrt(v + 1e-5)

    ln = layernorm or explicit_layernorm

    def bn(z, m, v, g, b):
        return F.batch_norm(z, m, v, g, b, training=False, eps=1e-5)

    def conv_block(x, w1, m1, v1, g1, b1, w2, m2, v2, g2, b2):
        h = torch.relu(bn(F.conv2d(x, w1, padding=1), m1, v1, g1, b1))
        return torch.relu(bn(F.conv2d(h, w2, padding=1), m2, v2, g2, b2) + x)

    def heads(z):
        return z.reshape(z.shape[0], 12, 64).transpose(0, 1)

    def bert_layer(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2):
        q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
        p = torch.softmax(q @ k.transpose(1, 2) / 8.0, dim=-1)
        ctx = (p @ v).transpose(0, 1).reshape(x.shape[0], 768)
        h1 = ln(ctx @ wo + bo + x) * g1 + be1
        ff = gelu(h1 @ w1 + b1) @ w2 + b2
        return ln(ff + h1) * g2 + be2

    def gru(x, w_ih, w_hh, b_ih, b_hh):
        H = w_hh.shape[1]
        h = torch.zeros(x.shape[1], H, dtype=x.dtype, device=x.device)
        for t in range(x.shape[0]):
            gi = x[t] @ w_ih.T + b_ih
            gh = h @ w_hh.T + b_hh
            r = torch.sigmoid(gi[:, :H] + gh[:, :H])
            z = torch.sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
            n = torch.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
            h = (1 - z) * n + z * h
        return h

    return {
        "gemm": lambda a, b: a @ b,
        "mlp": lambda x, w1, b1, w2, b2: torch.relu(x @ w1 + b1) @ w2 + b2,
        "conv_block": conv_block,
        "attention": lambda q, k, v: torch.softmax(q @ k.transpose(1, 2) / 8.0, dim=-1) @ v,
        "layernorm_gelu": lambda x, g, b: gelu(ln(x) * g + b),
        "bert_layer": bert_layer,
        "gru": gru,
        "gcn": lambda a, x, w1, w2: a @ (torch.relu(a @ (x @ w1)) @ w2),
    }
