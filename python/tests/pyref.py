"""The tests' oracle in plain Python floats (IEEE double): no NumPy, no PyTorch, so a bug in an
array library or in attnkit's own reference cannot hide in both sides of a comparison.

Inputs are nested lists (array.tolist()); the semantics are docs/architecture.md section 4.
"""

import bisect
import math


def attention(q, keys, values, query_start_loc, seq_lens, num_kv_heads, *, scale=None,
              causal=True, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    """q: [tokens][heads][d]; keys / values: per request, [seq_len][kv_heads][d] (dequantized).
    Returns (out [tokens][heads][d], lse [heads][tokens]) with lse in natural log; rows with no
    visible key give 0 and -inf (the sink logit with sinks). alibi: [heads] or [requests][heads]."""
    num_tokens = len(q)
    num_heads = len(q[0]) if num_tokens else 0
    d = len(q[0][0]) if num_tokens else 0
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = num_heads // num_kv_heads if num_heads else 1
    out = [[[0.0] * d for _ in range(num_heads)] for _ in range(num_tokens)]
    lse = [[-math.inf] * num_tokens for _ in range(num_heads)]
    left, right = window
    for r in range(len(seq_lens)):
        q0, q1 = query_start_loc[r], query_start_loc[r + 1]
        qlen, klen = q1 - q0, seq_lens[r]
        for i in range(qlen):
            t = q0 + i
            p = klen - qlen + i
            visible = [j for j in range(klen)
                       if (not causal or j <= p) and (left < 0 or j >= p - left) and (right < 0 or j <= p + right)]
            for h in range(num_heads):
                kvh = h // group
                qv = q[t][h]
                logits = []
                for j in visible:
                    kj = keys[r][j][kvh]
                    s = scale * sum(a * b for a, b in zip(qv, kj))
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if alibi is not None:
                        slope = alibi[r][h] if isinstance(alibi[0], list) else alibi[h]
                        s += -slope * abs(p - j)
                    logits.append(s)
                sink = None if sinks is None else sinks[h]
                terms = logits + ([sink] if sink is not None else [])
                if not terms or max(terms) == -math.inf:
                    continue
                m = max(terms)
                weights = [math.exp(s - m) for s in logits]
                denom = sum(weights) + (math.exp(sink - m) if sink is not None else 0.0)
                lse[h][t] = m + math.log(denom)
                if not logits:
                    continue
                acc = [0.0] * d
                for w, j in zip(weights, visible):
                    vj = values[r][j][kvh]
                    for e in range(d):
                        acc[e] += w * vj[e]
                out[t][h] = [a / denom for a in acc]
    return out, lse


def merge(out_a, lse_a, out_b, lse_b):
    """docs/architecture.md section 5 for one (token, head): returns (out, lse)."""
    def clean(x):
        return -math.inf if (math.isnan(x) or math.isinf(x)) else x
    la, lb = clean(lse_a), clean(lse_b)
    m = max(la, lb)
    if m == -math.inf:
        return [0.0] * len(out_a), -math.inf
    ea, eb = math.exp(la - m), math.exp(lb - m)
    wa, wb = ea / (ea + eb), eb / (ea + eb)
    out = [(wa * a if wa else 0.0) + (wb * b if wb else 0.0) for a, b in zip(out_a, out_b)]
    return out, m + math.log(ea + eb)


# ---- fp8 (OCP E4M3 "FN" and E5M2), decoded from their bit patterns ---------------------------

def _decode(code, exp_bits, man_bits, bias, fn):
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> man_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    if fn and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
        return math.nan
    if not fn and e == (1 << exp_bits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - man_bits)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


def fp8_value(code, fmt):
    """The value of an fp8 byte: fmt 'e4m3' (FN: no inf, max 448) or 'e5m2'."""
    return _decode(code, 4, 3, 7, True) if fmt == "e4m3" else _decode(code, 5, 2, 15, False)


_POSITIVE = {}


def _positive_codes(fmt):
    """(values, codes) of the finite non-negative codes, ascending."""
    if fmt not in _POSITIVE:
        pairs = sorted((fp8_value(c, fmt), c) for c in range(0x80)
                       if math.isfinite(fp8_value(c, fmt)))
        _POSITIVE[fmt] = ([v for v, _ in pairs], [c for _, c in pairs])
    return _POSITIVE[fmt]


def fp8_encode(x, fmt):
    """stored = saturate(round-to-nearest-even(x)) as a byte (e5m2 keeps +-inf; NaN -> 0x7F)."""
    if math.isnan(x):
        return 0x7F
    sign = 0x80 if (x < 0 or (x == 0 and math.copysign(1.0, x) < 0)) else 0
    a = abs(x)
    if fmt == "e5m2" and math.isinf(a):
        return sign | 0x7C
    values, codes = _positive_codes(fmt)
    a = min(a, values[-1])  # saturate
    i = bisect.bisect_left(values, a)
    if i < len(values) and values[i] == a:
        return sign | codes[i]
    lo, hi = i - 1, i
    dlo, dhi = a - values[lo], values[hi] - a
    if dlo < dhi or (dlo == dhi and codes[lo] % 2 == 0):
        return sign | codes[lo]
    return sign | codes[hi]
