"""PyTorch definitions of the dev set's exported models (torch runs only in the build venv).

* :class:`YoloDetector` — a YOLOv8n-shaped detector (C2f blocks, SPPF, PAN neck, decoupled head with a DFL box
  branch), exported as Ultralytics exports it: boxes decoded in the graph (softmax over 16 bins, a 1x1 conv
  with weights 0..15, distances to xywh times the stride) and concatenated with the sigmoid class scores into
  one [N, 84, anchors] output.  No pretrained weights can be had offline: random weights whose BatchNorm
  statistics are re-estimated on real photographs (:func:`reestimate_batchnorm`).
* :class:`LogMelClassifier` — a log-mel front end written as exporters write it (STFT as a Conv1d with a
  Hann-windowed DFT basis, power, mel MatMul, Clip(min=1e-10), Log) and a small CNN classifier (random
  weights, BatchNorm re-estimated on the audio); outputs the logits and the log-mel features.
* :class:`SentenceEncoder` — a Hugging Face BERT encoder with mean pooling and L2 normalisation (the
  sentence-transformers embedding); :func:`write_out_ops` swaps its GELU for the tanh form written out as ops
  and its LayerNorms for E[x^2] - E[x]^2, same weights.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class ConvBnSilu(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=None)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, channels: int, shortcut: bool):
        super().__init__()
        self.cv1, self.cv2 = ConvBnSilu(channels, channels, 3), ConvBnSilu(channels, channels, 3)
        self.shortcut = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.shortcut else y


class C2f(nn.Module):
    """Split the 1x1 conv's output in two, run bottlenecks on the second half, concatenate every stage."""

    def __init__(self, cin: int, cout: int, blocks: int, shortcut: bool):
        super().__init__()
        self.hidden = cout // 2
        self.cv1 = ConvBnSilu(cin, 2 * self.hidden)
        self.cv2 = ConvBnSilu((2 + blocks) * self.hidden, cout)
        self.blocks = nn.ModuleList(Bottleneck(self.hidden, shortcut) for _ in range(blocks))

    def forward(self, x):
        parts = list(self.cv1(x).split((self.hidden, self.hidden), 1))
        for block in self.blocks:
            parts.append(block(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.cv1, self.cv2 = ConvBnSilu(cin, cin // 2), ConvBnSilu(cin * 2, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        a = self.pool(x)
        b = self.pool(a)
        return self.cv2(torch.cat((x, a, b, self.pool(b)), 1))


class YoloDetector(nn.Module):
    """YOLOv8n's layout (width 0.25, depth 0.33); ``forward`` returns [N, 4 + classes, anchors]: box centre x,
    y, width, height in input pixels, then the class probabilities."""

    REG_MAX = 16
    STRIDES = (8, 16, 32)

    def __init__(self, classes: int = 80):
        super().__init__()
        self.classes = classes
        self.stem = nn.Sequential(ConvBnSilu(3, 16, 3, 2), ConvBnSilu(16, 32, 3, 2), C2f(32, 32, 1, True),
                                  ConvBnSilu(32, 64, 3, 2), C2f(64, 64, 2, True))
        self.down4 = nn.Sequential(ConvBnSilu(64, 128, 3, 2), C2f(128, 128, 2, True))
        self.down5 = nn.Sequential(ConvBnSilu(128, 256, 3, 2), C2f(256, 256, 1, True), SPPF(256, 256))
        self.top_down4, self.top_down3 = C2f(384, 128, 1, False), C2f(192, 64, 1, False)
        self.bottom_up4, self.bottom_up5 = ConvBnSilu(64, 64, 3, 2), ConvBnSilu(128, 128, 3, 2)
        self.out4, self.out5 = C2f(192, 128, 1, False), C2f(384, 256, 1, False)
        box_width, class_width = 64, max(64, min(classes, 100))
        self.box_heads = nn.ModuleList(nn.Sequential(ConvBnSilu(c, box_width, 3), ConvBnSilu(box_width, box_width, 3),
                                                     nn.Conv2d(box_width, 4 * self.REG_MAX, 1)) for c in (64, 128, 256))
        self.class_heads = nn.ModuleList(nn.Sequential(ConvBnSilu(c, class_width, 3),
                                                       ConvBnSilu(class_width, class_width, 3),
                                                       nn.Conv2d(class_width, classes, 1)) for c in (64, 128, 256))
        self.dfl = nn.Conv2d(self.REG_MAX, 1, 1, bias=False)
        self.dfl.weight.data[:] = torch.arange(self.REG_MAX, dtype=torch.float32).view(1, -1, 1, 1)
        self.dfl.requires_grad_(False)

    def features(self, x):
        p3 = self.stem(x)
        p4 = self.down4(p3)
        p5 = self.down5(p4)
        t4 = self.top_down4(torch.cat((F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4), 1))
        n3 = self.top_down3(torch.cat((F.interpolate(t4, scale_factor=2.0, mode="nearest"), p3), 1))
        n4 = self.out4(torch.cat((self.bottom_up4(n3), t4), 1))
        n5 = self.out5(torch.cat((self.bottom_up5(n4), p5), 1))
        return n3, n4, n5

    def forward(self, x):
        levels = self.features(x)
        boxes, scores, anchors, strides = [], [], [], []
        for level, stride, box_head, class_head in zip(levels, self.STRIDES, self.box_heads, self.class_heads):
            n, _, h, w = level.shape
            boxes.append(box_head(level).view(n, 4 * self.REG_MAX, h * w))
            scores.append(class_head(level).view(n, self.classes, h * w))
            ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32) + 0.5,
                                    torch.arange(w, dtype=torch.float32) + 0.5, indexing="ij")
            anchors.append(torch.stack((xs.reshape(-1), ys.reshape(-1))))
            strides.append(torch.full((1, h * w), float(stride)))
        box = torch.cat(boxes, 2)
        n, _, count = box.shape
        bins = box.view(n, 4, self.REG_MAX, count).transpose(2, 1).softmax(1)
        distance = self.dfl(bins).view(n, 4, count)
        anchor, stride = torch.cat(anchors, 1).unsqueeze(0), torch.cat(strides, 1).unsqueeze(0)
        left_top, right_bottom = distance.chunk(2, 1)
        top_left, bottom_right = anchor - left_top, anchor + right_bottom
        xywh = torch.cat(((top_left + bottom_right) / 2, bottom_right - top_left), 1) * stride
        return torch.cat((xywh, torch.cat(scores, 2).sigmoid()), 1)

    def shape_head_logits(self, batch, box_std: float = 2.5, class_mean: float = -9.5, class_std: float = 1.0):
        """Rescale the last 1x1 conv of each random head so that, on ``batch``, its logits have the spread of a
        trained head's, channel by channel: peaked DFL distributions (``box_std``), class logits mostly low
        (``class_mean``, ``class_std``) so that few anchors score high."""
        heads = [(h[-1], box_std, 0.0) for h in self.box_heads] + [(h[-1], class_std, class_mean)
                                                                     for h in self.class_heads]
        with torch.no_grad():
            levels = self.features(batch)
            for index, (conv, std, mean) in enumerate(heads):
                hidden = (self.box_heads if index < 3 else self.class_heads)[index % 3][:-1](levels[index % 3])
                logits = F.conv2d(hidden, conv.weight).transpose(0, 1).flatten(1)    # per output channel
                scale = std / logits.std(1)
                conv.weight.mul_(scale.view(-1, 1, 1, 1))
                conv.bias.copy_(mean - logits.mean(1) * scale)


def hann_dft_basis(n_fft: int) -> np.ndarray:
    """[2 * (n_fft // 2 + 1), 1, n_fft]: periodic-Hann-windowed cosines then (negated) sines of each rfft bin."""
    n = np.arange(n_fft)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)
    k = np.arange(n_fft // 2 + 1)[:, None]
    angle = 2 * np.pi * k * n / n_fft
    return np.concatenate((np.cos(angle) * window, -np.sin(angle) * window))[:, None, :].astype(np.float32)


def mel_filterbank(rate: int, n_fft: int, mels: int, low: float = 20.0, high: float | None = None) -> np.ndarray:
    """[mels, n_fft // 2 + 1] triangular filters equally spaced on the HTK mel scale, area-normalised."""
    def to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def to_hz(m):
        return 700.0 * (10 ** (np.asarray(m) / 2595.0) - 1.0)

    edges = to_hz(np.linspace(to_mel(low), to_mel(high or rate / 2), mels + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    bank = np.maximum(0.0, np.minimum(lower, upper))
    return (bank * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


class LogMelClassifier(nn.Module):
    """16 kHz audio [N, samples] -> (logits [N, classes], log-mel [N, mels, frames])."""

    def __init__(self, rate: int = 16000, n_fft: int = 400, hop: int = 160, mels: int = 64, classes: int = 12):
        super().__init__()
        self.n_fft, self.bins = n_fft, n_fft // 2 + 1
        self.stft = nn.Conv1d(1, 2 * self.bins, n_fft, hop, bias=False)
        self.stft.weight.data[:] = torch.from_numpy(hann_dft_basis(n_fft))
        self.register_buffer("mel", torch.from_numpy(mel_filterbank(rate, n_fft, mels)))
        self.stft.requires_grad_(False)
        blocks, channels = [], 1
        for width, stride in ((32, 2), (64, 2), (96, 2), (128, 1)):
            blocks += [nn.Conv2d(channels, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width, momentum=None),
                       nn.ReLU()]
            channels = width
        self.body = nn.Sequential(nn.BatchNorm2d(1, momentum=None), *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(channels, classes))

    def forward(self, audio):
        framed = F.pad(audio.unsqueeze(1), (self.n_fft // 2, self.n_fft // 2))
        spectrum = self.stft(framed)
        power = spectrum[:, :self.bins] ** 2 + spectrum[:, self.bins:] ** 2
        logmel = torch.log(torch.clamp(torch.matmul(self.mel, power), min=1e-10))
        return self.body(logmel.unsqueeze(1)), logmel


def reestimate_batchnorm(model: nn.Module, batches) -> None:
    """Set every BatchNorm's running mean and variance to their averages over ``batches`` (the modules were
    built with momentum None: a cumulative average), then put the model in eval mode."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
    model.train()
    with torch.no_grad():
        for batch in batches:
            model(batch)
    model.eval()


class SentenceEncoder(nn.Module):
    """BERT token states mean-pooled over the attention mask and L2-normalised: [N, hidden]."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        states = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)


class TanhGelu(nn.Module):
    """GELU's tanh approximation written out: x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""

    def forward(self, x):
        return x * 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class MomentsLayerNorm(nn.Module):
    """LayerNorm over the last axis from the first two moments: (x - E[x]) / sqrt(E[x^2] - E[x]^2 + eps)."""

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        variance = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(variance + self.eps) * self.weight + self.bias


def write_out_ops(model: nn.Module) -> nn.Module:
    """Swap every LayerNorm of ``model`` for :class:`MomentsLayerNorm` and every BERT intermediate activation
    for :class:`TanhGelu` (in place); returns the model."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(module, child_name, MomentsLayerNorm(child))
        if hasattr(module, "intermediate_act_fn"):
            module.intermediate_act_fn = TanhGelu()
    return model
