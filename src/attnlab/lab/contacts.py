"""Reading contacts out of a family: APC, precision at L/k, mean-field DCA, and the attention readout (issue #30).

    apc, symmetrize                 the average product correction (Dunn et al. 2008) on (..., L, L) scores
    precision_at, top_l_over        precision of the top-k long-range pairs (REFERENCES.md §12)
    mean_field_dca                  the classical baseline from the MSA alone (Morcos et al. 2011)
    pair_features, fit_logistic     Rao et al. 2021 (MSA Transformer): symmetrized, APC'd attention maps of
                                    every layer x head, read out by a logistic regression fitted on a few families
    categorical_jacobian_scores     the same kind of map for a model without attention maps (the ablation)

Inputs may be numpy arrays or torch tensors; outputs are numpy float64.

Example::

    F = apc(symmetrize(scores))                               # (L, L)
    p = precision_at(F, contacts, top_l_over(L, 5), min_sep=6)
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

__all__ = ["symmetrize", "apc", "long_range_pairs", "precision_at", "top_l_over", "mean_field_dca",
           "LogisticReadout", "fit_logistic", "predict_logistic", "pair_features", "categorical_jacobian_scores"]


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def symmetrize(F) -> np.ndarray:
    """(F + Fᵀ) / 2 over the last two axes; F (..., L, L)."""
    F = _np(F)
    return (F + np.swapaxes(F, -1, -2)) / 2


def apc(F) -> np.ndarray:
    """Average product correction (Dunn, Wahl, Gloor 2008, Bioinformatics 24:333), batched over leading axes.

    The diagonal is zeroed first, then F_apc(i, j) = F(i, j) - F(i, ·) F(·, j) / F(·, ·) with means over all
    entries (the MSA Transformer's convention). It removes the per-position background: a score that is only
    "position i is busy" x "position j is busy" (an outer product) goes to ~0, up to the O(1/L) the zeroed
    diagonal leaves.

    Args:
        F: (..., L, L) scores. Returns: (..., L, L).

    Example::

        F = apc(symmetrize(attn.mean(0)))      # attn (R, L, L) -> (L, L)
    """
    F = _np(F).copy()
    L = F.shape[-1]
    F[..., np.arange(L), np.arange(L)] = 0.0
    row = F.mean(-1, keepdims=True)                                  # (..., L, 1)
    col = F.mean(-2, keepdims=True)                                  # (..., 1, L)
    tot = F.mean((-1, -2), keepdims=True)                            # (..., 1, 1)
    safe = np.where(tot == 0, 1.0, tot)
    return F - np.where(tot == 0, 0.0, row * col / safe)


def long_range_pairs(L: int, min_sep: int) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) index arrays of the pairs i < j with j - i >= min_sep, row-major."""
    return np.triu_indices(L, k=max(1, min_sep))


def top_l_over(L: int, k: int) -> int:
    """floor(L / k): how many pairs "precision at L/k" counts (L = 48, k = 5 -> 9)."""
    return L // k


def precision_at(scores, contacts, k: int, min_sep: int) -> float:
    """Share of true contacts among the k highest-scoring pairs with j - i >= min_sep (upper triangle).

    Ties go to the pair earlier in row-major order, so the result is a function of the inputs alone; NaN
    scores rank last. k larger than the number of such pairs counts them all.

    Args:
        scores: (L, L); only i < j is read (symmetrize first if the map is not symmetric).
        contacts: (L, L) bool. k: number of pairs (>= 1). min_sep: smallest |i - j| counted.

    Example::

        precision_at(dca, fam.contacts, top_l_over(48, 5), min_sep=6)   # 1.0 = all 9 top pairs are contacts
    """
    if k < 1:
        raise ValueError(f"precision_at needs k >= 1, got {k} (top_l_over(L, m) is 0 when L < m)")
    S, C = _np(scores), np.asarray(contacts, dtype=bool)
    i, j = long_range_pairs(S.shape[-1], min_sep)
    s = np.nan_to_num(S[i, j], nan=-np.inf)
    top = np.argsort(-s, kind="stable")[:k]
    return float(C[i[top], j[top]].mean())


def mean_field_dca(msa, q: int, pseudocount: float = 0.5, theta: float = 0.2) -> np.ndarray:
    """Mean-field direct coupling analysis (Morcos et al. 2011, PNAS 108:E1293), scored by Frobenius norm + APC.

    Sequences are reweighted by 1 / (number of sequences, itself included, with identity > 1 - theta); the
    frequencies get a pseudocount λ (f_i = (1-λ) f_i + λ/q, f_ij = (1-λ) f_ij + λ/q², f_ii(a, b) = f_i(a) δ_ab);
    C_ij(a, b) = f_ij(a, b) - f_i(a) f_j(b) over the first q - 1 states (the last is the gauge); the couplings
    are e = -C⁻¹; each (q x q) block, padded with the zero row/column, is put in the zero-mean gauge, and
    its Frobenius norm, APC-corrected, is the pair's score.

    Args:
        msa: (M, L) int in [0, q). q: alphabet size. pseudocount: λ in [0, 1). theta: identity cut-off
            (0 turns reweighting off).
    Returns:
        (L, L) scores, symmetric; higher = more likely a contact.

    Example::

        F = mean_field_dca(fam.msa, q=8)
        precision_at(F, fam.contacts, 9, min_sep=6)
    """
    x = np.asarray(msa, dtype=np.int64)
    M, L = x.shape
    X = np.eye(q)[x].reshape(M, L * q)                                      # (M, L*q) one-hot
    matches = X @ X.T                                                       # (M, M) identical positions
    # "identity > 1 - theta" on integer counts, free of float rounding at the boundary; a sequence always
    # counts itself, so theta = 0 (identity > 1) turns reweighting off
    similar = matches > np.floor((1 - theta) * L + 1e-9)                    # (M, M)
    similar[np.diag_indices(M)] = True
    w = 1.0 / similar.sum(1)                                                # (M,)
    fi = (w @ X / w.sum()).reshape(L, q)                                    # (L, q)
    fij = ((X * w[:, None]).T @ X / w.sum()).reshape(L, q, L, q)            # (L, q, L, q)
    fi = (1 - pseudocount) * fi + pseudocount / q
    fij = (1 - pseudocount) * fij + pseudocount / q**2
    idx = np.arange(L)
    fij[idx, :, idx, :] = fi[:, :, None] * np.eye(q)                        # f_ii(a, b) = f_i(a) δ_ab
    C = fij - fi[:, :, None, None] * fi[None, None, :, :]                   # (L, q, L, q)
    C = C[:, : q - 1, :, : q - 1].reshape(L * (q - 1), L * (q - 1))
    e = np.zeros((L, q, L, q))
    e[:, : q - 1, :, : q - 1] = -np.linalg.inv(C).reshape(L, q - 1, L, q - 1)
    e = e - e.mean(1, keepdims=True) - e.mean(3, keepdims=True) + e.mean((1, 3), keepdims=True)  # zero-mean gauge
    F = np.sqrt((e**2).sum((1, 3)))                                         # (L, L)
    return apc(symmetrize(F))


class LogisticReadout(NamedTuple):
    """A fitted logistic regression on raw features: p = sigmoid(X @ w + b). Unpacks as (w, b)."""
    w: np.ndarray  # (F,)
    b: float

    def predict(self, X) -> np.ndarray:
        """(n,) probabilities for X (n, F)."""
        z = _np(X) @ self.w + self.b
        return np.exp(-np.logaddexp(0.0, -z))


def fit_logistic(X, y, l2: float = 1e-3, max_iter: int = 100) -> LogisticReadout:
    """L2-regularised logistic regression by Newton's method with a backtracking line search (float64).

    Minimises mean log-loss + l2 / 2 * ||w||² over standardized features (the bias is not penalised), so the
    penalty means the same at any n and any feature scale; the returned weights apply to raw X.

    Args:
        X: (n, F) features. y: (n,) bool labels. l2: penalty (> 0 keeps separable data finite).
    Returns:
        LogisticReadout(w (F,), b).

    Example::

        model = fit_logistic(pair_feats[mask], contacts[mask])
        p = predict_logistic(model, test_feats)                # (n,)
    """
    X, t = _np(X), np.asarray(y, dtype=np.float64)
    n, nf = X.shape
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    Z = np.concatenate([(X - mu) / sd, np.ones((n, 1))], axis=1)           # (n, F + 1), bias last
    pen = np.full(nf + 1, l2)
    pen[-1] = 0.0

    def loss(theta: np.ndarray) -> float:
        z = Z @ theta
        return float(np.mean(np.logaddexp(0.0, z) - t * z) + 0.5 * (pen * theta**2).sum())

    theta = np.zeros(nf + 1)
    cur = loss(theta)
    for _ in range(max_iter):
        p = np.exp(-np.logaddexp(0.0, -(Z @ theta)))                       # (n,)
        grad = Z.T @ (p - t) / n + pen * theta
        hess = (Z * (p * (1 - p))[:, None]).T @ Z / n + np.diag(pen) + 1e-12 * np.eye(nf + 1)
        step = np.linalg.solve(hess, grad)
        lr = 1.0
        while lr > 1e-8 and loss(theta - lr * step) > cur - 1e-4 * lr * grad @ step:
            lr /= 2
        theta, prev, cur = theta - lr * step, cur, loss(theta - lr * step)
        if prev - cur < 1e-12 * max(1.0, abs(cur)):
            break
    w = theta[:-1] / sd
    return LogisticReadout(w=w, b=float(theta[-1] - (w * mu).sum()))


def predict_logistic(model: LogisticReadout, X) -> np.ndarray:
    """(n,) probabilities of ``model`` on X (n, F)."""
    return model.predict(X)


def pair_features(maps) -> np.ndarray:
    """The Rao et al. (2021) readout features: every (layer, head) map symmetrized, then APC'd.

    Args:
        maps: (layers, H, L, L) attention maps (row attention averaged over the MSA's rows).
    Returns:
        (L, L, layers * H), feature index = layer * H + head.

    Example::

        feats = pair_features(row_attn)              # (48, 48, layers*H)
        i, j = long_range_pairs(48, 6); X = feats[i, j]
    """
    F = apc(symmetrize(maps))                                              # (layers, H, L, L)
    nl, nh, L, _ = F.shape
    return np.moveaxis(F.reshape(nl * nh, L, L), 0, -1)


def categorical_jacobian_scores(predict_fn: Callable, msa_rows, q: int, chunk: int = 64) -> np.ndarray:
    """Pair scores of a model without attention maps: how mutating residue j of row 0 moves row 0's logits at i.

    For every position j and symbol b, row 0's residue j is set to b (the L * q inputs go through
    ``predict_fn`` in chunks); row 0's logits form a block J[i, a, j, b], centred over b (the change relative to
    the unmutated input: its logits, one of the q rows here, are a constant in b and cancel in the centring,
    so no extra call is needed) and over a (logits are only defined up to a constant).
    score(i, j) = ||J[i, :, j, :]||_F, diagonal zeroed, symmetrized, APC'd.

    Args:
        predict_fn: (N, R, L) int64 tensor -> (N, R, L, q) logits (tensor or array).
        msa_rows: (R, L) int, row 0 is the one mutated. q: alphabet size. chunk: inputs per call.
    Returns:
        (L, L) scores.

    Example::

        F = categorical_jacobian_scores(lambda x: model(x), torch.as_tensor(fam.msa[:16]), q=8)
    """
    rows = torch.as_tensor(np.asarray(msa_rows), dtype=torch.long)           # (R, L)
    R, L = rows.shape
    mutants = rows.repeat(L * q, 1, 1)                                        # (L*q, R, L)
    j, b = torch.arange(L).repeat_interleave(q), torch.arange(q).repeat(L)   # (L*q,) each
    mutants[torch.arange(L * q), 0, j] = b
    out = []
    with torch.no_grad():
        for s in range(0, L * q, chunk):
            out.append(_np(predict_fn(mutants[s : s + chunk]))[:, 0])       # (n, L, q) row 0's logits
    J = np.concatenate(out).reshape(L, q, L, q).transpose(2, 3, 0, 1)        # (i, a, j, b)
    J = J - J.mean(3, keepdims=True)
    J = J - J.mean(1, keepdims=True)
    F = np.sqrt((J**2).sum((1, 3)))                                          # (L, L)
    return apc(symmetrize(F))
