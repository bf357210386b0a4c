"""The torch networks θ = (φ, ψ): `MLP` and `SmallCNN` split into a feature extractor φ (`embed(x)`, the
d-dimensional embedding that XCLP builds its graph on) and a classifier head ψ (`head`);
`forward(x) = head(embed(x))`. Built through xclp.training.models.build_network; a module of their own
because a class that subclasses nn.Module needs torch to be defined, and xclp.training.models must not
import torch with itself (it says why)."""

from __future__ import annotations

import math

import torch
from torch import nn


def image_side(n_features: int) -> int:
    """Side of a square single-channel image with `n_features` pixels (28 for 784, 8 for 64)."""
    side = int(round(math.sqrt(n_features)))
    if side * side != n_features:
        raise ValueError(f"the CNN needs square images; {n_features} features is not a square")
    return side


class MLP(nn.Module):
    """in → hidden (ReLU) → embedding (ReLU) = φ; embedding → classes = ψ."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 256, embed_dim: int = 128):
        super().__init__()
        self.n_features, self.n_classes, self.embed_dim = n_features, n_classes, embed_dim
        self.features = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, embed_dim), nn.ReLU())
        self.head = nn.Linear(embed_dim, n_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


class SmallCNN(nn.Module):
    """Two conv–pool blocks and a dense embedding layer = φ; a linear head = ψ.

    Takes flat rows of a square single-channel image (28×28 Fashion-MNIST / MNIST, 8×8 digits).
    """

    def __init__(self, n_features: int, n_classes: int, embed_dim: int = 128, width: int = 32):
        super().__init__()
        self.side = image_side(n_features)
        self.n_features, self.n_classes, self.embed_dim = n_features, n_classes, embed_dim
        self.conv = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 2 * width * (self.side // 4) ** 2
        self.dense = nn.Sequential(nn.Flatten(), nn.Linear(flat, embed_dim), nn.ReLU())
        self.head = nn.Linear(embed_dim, n_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.conv(x.reshape(-1, 1, self.side, self.side)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


