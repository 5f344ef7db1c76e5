"""The baseline for `capsnet bench`: CapsNet as the popular PyTorch tutorials write it.

A literal rendering of the tutorials' approach, written from their description
and kept outside the package on purpose (shared/STYLE.md forbids both of its
habits in the library):

- DigitCaps stores ``W`` as ``(1, I, J, Dout, Din)`` and *tiles* it across the
  batch with ``torch.cat([self.W] * batch_size)``; the lower capsules are
  stacked once per class, ``torch.stack([x] * J, dim=2)``, and every vote is a
  tiny ``(Dout, Din) @ (Din, 1)`` matmul.
- The routing logits ``b_ij`` are one ``(1, I, J, 1)`` tensor *shared by the
  batch*, updated with the batch mean of the agreement (``share_logits=True``).
  With ``share_logits=False`` they are kept per example, which is Procedure 1
  of Sabour et al. (2017) and what capsnet's ``DynamicRouting`` does.

Where the tutorials' own details differ from capsnet's maths, this file follows
capsnet, so that the two can be compared number for number (tests/test_bench.py):
the softmax is over the J digit capsules; squash acts on the 16-D pose with
capsnet's epsilon inside the square root; the routing bias (J, Dout), as in the
authors' code, is added to ``s_j`` before the squash; the primary capsules come
from one convolution ordered (type, row, column), ``dim`` consecutive channels
per capsule; the decoder is masked by the label when one is given. The
speed-relevant parts (tiling, stacking, shared logits) are left as they are.

Self-contained: imports torch only. It reads a capsnet ``CapsNet`` through its
attributes in ``from_capsnet`` and never imports the package.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TutorialOutput", "TutorialCapsNet", "squash"]

# As capsnet.ops._eps(float32): max(1e-8, 1e3 * finfo.tiny) = 1e-8.
EPS = 1e-8


class TutorialOutput(NamedTuple):
    poses: torch.Tensor  # (B, J, Dout) digit capsules
    lengths: torch.Tensor  # (B, J)
    reconstructions: torch.Tensor | None  # (B, C, H, W)
    coupling: torch.Tensor  # (B, I, J) last round's coefficients (a broadcast view when shared)


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Eq. 1 the tutorials' way, ``|s|^2 s / ((1 + |s|^2) |s|)``, epsilon as capsnet."""
    squared_norm = (s ** 2).sum(dim, keepdim=True)
    return squared_norm * s / ((1.0 + squared_norm) * torch.sqrt(squared_norm + EPS))


class PrimaryCaps(nn.Module):
    """One conv of ``types * dim`` channels; capsule = ``dim`` channels of one type at one place."""

    def __init__(self, *, in_channels: int, types: int, dim: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.types, self.dim = types, dim
        self.conv = nn.Conv2d(in_channels, types * dim, kernel_size=kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, C, H, W) -> (B, I, Din), I = types * H' * W' ordered (type, row, column)."""
        u = self.conv(x)  # (B, types*Din, H', W')
        B, _, H, W = u.shape
        u = u.view(B, self.types, self.dim, H, W).permute(0, 1, 3, 4, 2)  # (B, types, H', W', Din)
        return squash(u.reshape(B, self.types * H * W, self.dim))  # (B, I, Din)


class DigitCaps(nn.Module):
    """The tutorials' DigitCaps: weight tiled per batch, inputs stacked per class."""

    def __init__(self, *, num_routes: int, in_dim: int, num_caps: int, out_dim: int, iterations: int,
                 share_logits: bool, bias: bool) -> None:
        super().__init__()
        self.num_routes, self.num_caps, self.iterations = num_routes, num_caps, iterations
        self.share_logits = share_logits
        self.W = nn.Parameter(torch.randn(1, num_routes, num_caps, out_dim, in_dim))  # (1, I, J, Dout, Din)
        self.bias = nn.Parameter(torch.full((num_caps, out_dim), 0.1)) if bias else None  # (J, Dout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: x (B, I, Din) -> poses (B, J, Dout), coupling (B, I, J)."""
        batch_size = x.size(0)
        x = torch.stack([x] * self.num_caps, dim=2).unsqueeze(4)  # (B, I, J, Din, 1)
        W = torch.cat([self.W] * batch_size, dim=0)  # (B, I, J, Dout, Din)
        u_hat = torch.matmul(W, x)  # (B, I, J, Dout, 1)

        rows = 1 if self.share_logits else batch_size
        b_ij = torch.zeros(rows, self.num_routes, self.num_caps, 1, device=x.device, dtype=x.dtype)  # (1 or B, I, J, 1)
        for iteration in range(self.iterations):
            c_ij = F.softmax(b_ij, dim=2)  # over the J digit capsules; (1 or B, I, J, 1)
            if self.share_logits:
                c_ij = torch.cat([c_ij] * batch_size, dim=0)  # (B, I, J, 1)
            c_ij = c_ij.unsqueeze(4)  # (B, I, J, 1, 1)
            s_j = (c_ij * u_hat).sum(dim=1, keepdim=True)  # (B, 1, J, Dout, 1)
            if self.bias is not None:
                s_j = s_j + self.bias.view(1, 1, self.num_caps, -1, 1)
            v_j = squash(s_j, dim=3)  # (B, 1, J, Dout, 1)
            if iteration < self.iterations - 1:
                a_ij = torch.matmul(u_hat.transpose(3, 4), torch.cat([v_j] * self.num_routes, dim=1))  # (B, I, J, 1, 1)
                a_ij = a_ij.squeeze(4)  # (B, I, J, 1)
                b_ij = b_ij + (a_ij.mean(dim=0, keepdim=True) if self.share_logits else a_ij)
        coupling = c_ij.view(batch_size, self.num_routes, self.num_caps)  # (B, I, J)
        return v_j.view(batch_size, self.num_caps, -1), coupling  # (B, J, Dout), (B, I, J)


class Decoder(nn.Module):
    """Three fully connected layers on the digit capsules masked to one class."""

    def __init__(self, *, in_features: int, hidden: tuple[int, ...], out_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.out_shape = out_shape
        sizes = [in_features, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        C, H, W = out_shape
        layers += [nn.Linear(sizes[-1], C * H * W), nn.Sigmoid()]
        self.reconstruction_layers = nn.Sequential(*layers)

    def forward(self, poses: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Shapes: poses (B, J, Dout), index (B,) -> (B, C, H, W)."""
        B, J, _ = poses.shape
        masked = torch.eye(J, device=poses.device, dtype=poses.dtype).index_select(0, index.long())  # (B, J)
        t = (poses * masked[:, :, None]).view(B, -1)  # (B, J*Dout)
        return self.reconstruction_layers(t).view(B, *self.out_shape)  # (B, C, H, W)


class TutorialCapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> DigitCaps (tutorial routing) -> Decoder; MNIST sizes by default."""

    def __init__(
        self,
        *,
        in_channels: int = 1,
        image_size: tuple[int, int] = (28, 28),
        num_classes: int = 10,
        conv1_channels: int = 256,
        conv1_kernel: int = 9,
        primary_types: int = 32,
        primary_dim: int = 8,
        primary_kernel: int = 9,
        primary_stride: int = 2,
        digit_dim: int = 16,
        routing_iterations: int = 3,
        routing_bias: bool = True,
        decoder: bool = True,
        decoder_hidden: tuple[int, ...] = (512, 1024),
        share_logits: bool = True,
    ) -> None:
        super().__init__()
        H, W = image_size
        grid = [(n - conv1_kernel + 1 - primary_kernel) // primary_stride + 1 for n in (H, W)]
        num_routes = primary_types * grid[0] * grid[1]
        self.conv1 = nn.Conv2d(in_channels, conv1_channels, kernel_size=conv1_kernel)
        self.primary_capsules = PrimaryCaps(in_channels=conv1_channels, types=primary_types, dim=primary_dim,
                                            kernel_size=primary_kernel, stride=primary_stride)
        self.digit_capsules = DigitCaps(num_routes=num_routes, in_dim=primary_dim, num_caps=num_classes,
                                        out_dim=digit_dim, iterations=routing_iterations,
                                        share_logits=share_logits, bias=routing_bias)
        self.decoder = (Decoder(in_features=num_classes * digit_dim, hidden=tuple(decoder_hidden),
                                out_shape=(in_channels, H, W)) if decoder else None)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> TutorialOutput:
        """Shapes: images (B, C, H, W), labels (B,) or None -> poses (B, J, D), lengths (B, J),
        reconstructions (B, C, H, W) or None, coupling (B, I, J)."""
        x = F.relu(self.conv1(images))  # (B, 256, 20, 20)
        u = self.primary_capsules(x)  # (B, I, Din)
        poses, coupling = self.digit_capsules(u)  # (B, J, Dout), (B, I, J)
        lengths = torch.sqrt((poses ** 2).sum(dim=2) + EPS)  # (B, J)
        reconstructions = None
        if self.decoder is not None:
            index = labels if labels is not None else lengths.argmax(dim=1)
            reconstructions = self.decoder(poses, index)
        return TutorialOutput(poses, lengths, reconstructions, coupling)

    # --- parameter layout shared with capsnet.CapsNet ---------------------------------

    @classmethod
    def from_capsnet(cls, model: nn.Module, *, share_logits: bool = True) -> "TutorialCapsNet":
        """A baseline with ``model``'s sizes and a copy of its weights (same device and dtype)."""
        cfg = model.config
        if cfg.leaky_routing or cfg.detach_agreement:
            raise ValueError("the tutorial baseline has neither leaky routing nor detached agreement")
        baseline = cls(in_channels=cfg.in_channels, image_size=(cfg.input_height, cfg.input_width),
                       num_classes=cfg.num_classes, conv1_channels=cfg.conv1_channels, conv1_kernel=cfg.conv1_kernel,
                       primary_types=cfg.primary_types, primary_dim=cfg.primary_dim,
                       primary_kernel=cfg.primary_kernel, primary_stride=cfg.primary_stride,
                       digit_dim=cfg.digit_dim, routing_iterations=cfg.routing_iterations,
                       routing_bias=cfg.routing_bias, decoder=cfg.decoder, decoder_hidden=cfg.decoder_hidden,
                       share_logits=share_logits)
        ref = next(model.parameters())
        baseline.to(device=ref.device, dtype=ref.dtype)
        baseline.load_from_capsnet(model)
        return baseline

    @staticmethod
    def convert_from_capsnet(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """capsnet CapsNet names and layouts -> this module's (works for gradients too)."""
        out: dict[str, torch.Tensor] = {}
        for name, t in state.items():
            if name == "digits.weight":
                out["digit_capsules.W"] = t.permute(1, 2, 3, 0).unsqueeze(0)  # (Din, I, J, Dout) -> (1, I, J, Dout, Din)
            elif name == "digits.bias":
                out["digit_capsules.bias"] = t  # (J, Dout)
            elif name.startswith("primary.conv."):
                out["primary_capsules.conv." + name[len("primary.conv."):]] = t
            elif name.startswith("decoder.net."):
                out["decoder.reconstruction_layers." + name[len("decoder.net."):]] = t
            elif name.startswith("conv1."):
                out[name] = t
            else:
                raise KeyError(f"no tutorial counterpart for capsnet parameter {name!r}")
        return out

    @staticmethod
    def convert_to_capsnet(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This module's names and layouts -> capsnet CapsNet's (works for gradients too)."""
        out: dict[str, torch.Tensor] = {}
        for name, t in state.items():
            if name == "digit_capsules.W":
                out["digits.weight"] = t.squeeze(0).permute(3, 0, 1, 2)  # (1, I, J, Dout, Din) -> (Din, I, J, Dout)
            elif name == "digit_capsules.bias":
                out["digits.bias"] = t
            elif name.startswith("primary_capsules.conv."):
                out["primary.conv." + name[len("primary_capsules.conv."):]] = t
            elif name.startswith("decoder.reconstruction_layers."):
                out["decoder.net." + name[len("decoder.reconstruction_layers."):]] = t
            elif name.startswith("conv1."):
                out[name] = t
            else:
                raise KeyError(f"no capsnet counterpart for tutorial parameter {name!r}")
        return out

    @torch.no_grad()
    def load_from_capsnet(self, model: nn.Module) -> None:
        """Copy every parameter of a capsnet ``CapsNet`` of the same sizes into this module."""
        converted = self.convert_from_capsnet(dict(model.named_parameters()))
        own = dict(self.named_parameters())
        if set(converted) != set(own):
            raise ValueError(f"parameters differ: capsnet-only {sorted(set(converted) - set(own))}, "
                             f"tutorial-only {sorted(set(own) - set(converted))}")
        for name, p in own.items():
            src = converted[name]
            if src.shape != p.shape:
                raise ValueError(f"{name}: capsnet gives shape {tuple(src.shape)}, this module has {tuple(p.shape)}")
            p.copy_(src)

    def capsnet_state_dict(self) -> dict[str, Any]:
        """This module's parameters under capsnet's names and layouts (``CapsNet.load_state_dict`` takes it)."""
        return {k: v.detach().contiguous().clone() for k, v in self.convert_to_capsnet(dict(self.named_parameters())).items()}
