#!/usr/bin/env python
"""Train the small CNN that ``ppqlike demo`` quantizes by default.

Writes ``ppqlike/data/demo_model.onnx`` (opset 13, IR version 10).

Data
----
``ppqlike/data/digits.npz`` holds the UCI "Optical Recognition of Handwritten
Digits" test set as shipped by scikit-learn (``sklearn.datasets.load_digits``,
scikit-learn 1.9.1): 1797 grey images of 8x8 pixels, values 0..16, 10 classes.
Original source: E. Alpaydin, C. Kaynak, UCI Machine Learning Repository,
https://archive.ics.uci.edu/dataset/80 (licence CC BY 4.0); scikit-learn ships
it under its BSD-3-Clause licence.  It was extracted once with scikit-learn and
is bundled, so this script (and ppqlike) does not need scikit-learn;
``--extract-data`` re-creates the file from scikit-learn (the arrays come out
identical).  Arrays:

* ``images``    uint8 [1797, 8, 8], values 0..16
* ``labels``    int64 [1797], 0..9
* ``train_index``       int64 [1200] training images
* ``calibration_index`` int64 [200]  calibration images for quantization, a
  subset of ``train_index`` (calibration data need not be held out from
  training)
* ``test_index``        int64 [597]  held-out test images, disjoint from
  ``train_index``

(``ppqlike.cli.load_demo_data(split)`` reads ``f"{split}_index"``.)

The split was drawn once with ``numpy.random.default_rng(20240601)``: a
permutation of all indices, the first 1200 for training, the other 597 for
test, and 200 calibration indices chosen without replacement from the training
ones; each index array is sorted.

Preprocessing the model expects
-------------------------------
Input ``image``: float32 [N, 1, 8, 8] (N is dynamic) holding ``x / 16 - 0.5``
where ``x`` is the raw 0..16 pixel value, i.e. values in [-0.5, 0.5].
Output ``logits``: float32 [N, 10]; the predicted digit is ``argmax``.
The same string is stored in the model's metadata_props under the key
``ppqlike.preprocess``.

Model
-----
::

    image -> Conv 3x3 1->16 pad 1 (no bias) -> BatchNormalization -> Relu = a1
    a1 -> Conv 3x3 depthwise (group=16) pad 1 -> Relu = a2
    Add(a1, a2) -> MaxPool 2x2 stride 2 -> Conv 3x3 16->32 pad 1 -> Clip(0, 6)
      -> GlobalAveragePool -> Flatten -> Gemm 32->10 = logits

(The conv after the pool is 3x3 rather than 1x1: with a 1x1 conv the global
average pool sees only 6x6-pixel local features and the model stalls near 89%
test accuracy; the 3x3 conv on the 4x4 map gives about 98%.)

The BatchNormalization is a real BN: it is trained with batch statistics, and
after training its running mean/variance are re-estimated with the final
weights over the whole training split ("precise BN"), so its statistics are
the true, non-trivial population statistics of the conv output.

Training: numpy only (hand-written forward and backward passes, no deep
learning framework), Adam with cosine learning-rate decay, fixed seed and
fixed epoch count (100 epochs, batch 32, lr 3e-3, weight decay 1e-4 on
weights, random 1-pixel shifts as augmentation); BLAS is pinned to one
thread.  Runs in about 10-15 s on one core.  At the end the exported ONNX
model is run with onnxruntime on the test split and must agree with the numpy
forward pass; the script exits non-zero if they disagree or if the test
accuracy is below 95%.

Usage::

    python tools/train_demo_model.py [--epochs 100] [--seed 0] [--out PATH]
    python tools/train_demo_model.py --extract-data   # needs scikit-learn
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(ROOT, "ppqlike", "data")
PREPROCESS = "x / 16 - 0.5"
SPLIT_SEED = 20240601
BN_EPS = 1e-5
C1, C3, NCLS = 16, 32, 10
K3 = 3  # kernel size of conv3 (the code also supports 1; see the docstring)


def preprocess(images_u8):
    """uint8 [N,8,8] raw 0..16 -> float32 [N,1,8,8] as the model expects."""
    return (images_u8.astype(np.float32) / 16.0 - 0.5)[:, None, :, :]


def extract_data(path):
    """Write the bundled data file from scikit-learn (only needed once)."""
    from sklearn.datasets import load_digits
    d = load_digits()
    images = d.images.astype(np.uint8)
    assert np.array_equal(images, d.images) and images.shape == (1797, 8, 8)
    labels = d.target.astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    perm = rng.permutation(len(labels))
    train_index = np.sort(perm[:1200])
    test_index = np.sort(perm[1200:])
    calibration_index = np.sort(rng.choice(train_index, 200, replace=False))
    np.savez_compressed(path, images=images, labels=labels,
                        train_index=train_index.astype(np.int64),
                        calibration_index=calibration_index.astype(np.int64),
                        test_index=test_index.astype(np.int64))


# ---------------------------------------------------------------- layers
# Activations are kept NHWC internally; weights are kept in ONNX layout.

def patches3x3(x):
    """x [N,H,W,C] -> 3x3 patches with zero padding 1: [N,H,W,C,9], k = 3*di + dj."""
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return np.stack([xp[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)], axis=-1)


def patches3x3_backward(dp):
    """Adjoint of patches3x3: dp [N,H,W,C,9] -> dx [N,H,W,C]."""
    n, h, w, c, _ = dp.shape
    dxp = np.zeros((n, h + 2, w + 2, c), dtype=dp.dtype)
    for k in range(9):
        i, j = divmod(k, 3)
        dxp[:, i:i + h, j:j + w, :] += dp[..., k]
    return dxp[:, 1:-1, 1:-1, :]


def init_params(rng):
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {
        "conv1.w": he((C1, 1, 3, 3), 9),
        "bn1.scale": np.ones(C1, np.float32),
        "bn1.bias": np.zeros(C1, np.float32),
        "dw.w": he((C1, 1, 3, 3), 9),
        "dw.b": np.zeros(C1, np.float32),
        "conv3.w": he((C3, C1, K3, K3), C1 * K3 * K3),
        "conv3.b": np.full(C3, 0.1, np.float32),
        "fc.w": (rng.standard_normal((NCLS, C3)) * np.sqrt(1.0 / C3)).astype(np.float32),
        "fc.b": np.zeros(NCLS, np.float32),
    }


def forward(p, x, bn_stats=None):
    """x: float32 [N,1,8,8] preprocessed.  bn_stats=None: training mode (batch
    statistics); else (mean, var) running statistics.  Returns logits, cache."""
    xh = x.transpose(0, 2, 3, 1)                                     # [N,8,8,1]
    P1 = patches3x3(xh).reshape(*xh.shape[:3], 9)                    # C=1
    z1 = P1 @ p["conv1.w"].reshape(C1, 9).T                          # [N,8,8,16]
    if bn_stats is None:
        mu = z1.mean(axis=(0, 1, 2))
        var = z1.var(axis=(0, 1, 2))
    else:
        mu, var = bn_stats
    inv = 1.0 / np.sqrt(var + BN_EPS)
    xhat = (z1 - mu) * inv
    y1 = xhat * p["bn1.scale"] + p["bn1.bias"]
    a1 = np.maximum(y1, 0)
    Pd = patches3x3(a1)                                              # [N,8,8,16,9]
    z2 = np.einsum("nhwck,ck->nhwc", Pd, p["dw.w"].reshape(C1, 9)) + p["dw.b"]
    a2 = np.maximum(z2, 0)
    r = a1 + a2
    n = r.shape[0]
    rb = r.reshape(n, 4, 2, 4, 2, C1).transpose(0, 1, 3, 5, 2, 4).reshape(n, 4, 4, C1, 4)
    am = rb.argmax(axis=-1)
    m = np.take_along_axis(rb, am[..., None], axis=-1)[..., 0]      # [N,4,4,16]
    P3 = patches3x3(m).reshape(n, 4, 4, C1 * 9) if K3 == 3 else m
    z3 = P3 @ p["conv3.w"].reshape(C3, -1).T + p["conv3.b"]          # [N,4,4,32]
    a3 = np.clip(z3, 0, 6)
    g = a3.mean(axis=(1, 2))                                         # [N,32]
    logits = g @ p["fc.w"].T + p["fc.b"]
    cache = dict(P1=P1, z1=z1, mu=mu, var=var, inv=inv, xhat=xhat, y1=y1, a1=a1, Pd=Pd,
                 z2=z2, am=am, P3=P3, z3=z3, g=g)
    return logits, cache


def backward(p, c, dlogits):
    gr = {}
    n = dlogits.shape[0]
    gr["fc.w"] = dlogits.T @ c["g"]
    gr["fc.b"] = dlogits.sum(0)
    dg = dlogits @ p["fc.w"]                                         # [N,32]
    da3 = np.broadcast_to(dg[:, None, None, :] / 16.0, c["z3"].shape)
    dz3 = da3 * ((c["z3"] > 0) & (c["z3"] < 6))
    P3 = c["P3"]
    gr["conv3.w"] = (dz3.reshape(-1, C3).T @ P3.reshape(-1, P3.shape[-1])).reshape(p["conv3.w"].shape)
    gr["conv3.b"] = dz3.sum(axis=(0, 1, 2))
    dP3 = dz3 @ p["conv3.w"].reshape(C3, -1)
    dm = patches3x3_backward(dP3.reshape(n, 4, 4, C1, 9)) if K3 == 3 else dP3   # [N,4,4,16]
    drb = np.zeros((n, 4, 4, C1, 4), dm.dtype)
    np.put_along_axis(drb, c["am"][..., None], dm[..., None], axis=-1)
    dr = drb.reshape(n, 4, 4, C1, 2, 2).transpose(0, 1, 4, 2, 5, 3).reshape(n, 8, 8, C1)
    dz2 = dr * (c["z2"] > 0)
    gr["dw.w"] = np.einsum("nhwck,nhwc->ck", c["Pd"], dz2).reshape(C1, 1, 3, 3)
    gr["dw.b"] = dz2.sum(axis=(0, 1, 2))
    dPd = dz2[..., None] * p["dw.w"].reshape(C1, 9)
    da1 = dr + patches3x3_backward(dPd)
    dy1 = da1 * (c["y1"] > 0)
    gr["bn1.scale"] = (dy1 * c["xhat"]).sum(axis=(0, 1, 2))
    gr["bn1.bias"] = dy1.sum(axis=(0, 1, 2))
    dxhat = dy1 * p["bn1.scale"]
    cnt = dxhat.shape[0] * dxhat.shape[1] * dxhat.shape[2]
    dz1 = c["inv"] / cnt * (cnt * dxhat - dxhat.sum(axis=(0, 1, 2))
                            - c["xhat"] * (dxhat * c["xhat"]).sum(axis=(0, 1, 2)))
    gr["conv1.w"] = (dz1.reshape(-1, C1).T @ c["P1"].reshape(-1, 9)).reshape(C1, 1, 3, 3)
    return gr


def softmax_xent(logits, y):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
    d = prob.copy()
    d[np.arange(len(y)), y] -= 1
    return loss, (d / len(y)).astype(np.float32)


def bn_population_stats(p, x, batch=400):
    """Precise BN: exact mean/variance of the conv1 output over x."""
    s = np.zeros(C1, np.float64)
    s2 = np.zeros(C1, np.float64)
    cnt = 0
    w = p["conv1.w"].reshape(C1, 9).T
    for i in range(0, len(x), batch):
        xh = x[i:i + batch].transpose(0, 2, 3, 1)
        z1 = (patches3x3(xh).reshape(*xh.shape[:3], 9) @ w).reshape(-1, C1).astype(np.float64)
        s += z1.sum(0)
        s2 += (z1 * z1).sum(0)
        cnt += len(z1)
    mean = s / cnt
    return mean.astype(np.float32), (s2 / cnt - mean * mean).astype(np.float32)


def predict(p, x, bn_stats, batch=500):
    return np.concatenate([forward(p, x[i:i + batch], bn_stats)[0] for i in range(0, len(x), batch)])


def train(x, y, epochs, seed, batch=32, lr=3e-3, wd=1e-4, log=print):
    rng = np.random.default_rng(seed)
    p = init_params(rng)
    mom_m = {k: np.zeros_like(v) for k, v in p.items()}
    mom_v = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2 = 0.9, 0.999
    run_mu, run_var = np.zeros(C1, np.float32), np.ones(C1, np.float32)
    steps_per_epoch = (len(x) + batch - 1) // batch
    total = epochs * steps_per_epoch
    t = 0
    for ep in range(epochs):
        order = rng.permutation(len(x))
        tot_loss = 0.0
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            xb = x[idx]
            # light augmentation: random shift of up to 1 pixel (zero = -0.5 fill)
            dy, dx = rng.integers(-1, 2, size=2)
            if dy or dx:
                xb = np.roll(xb, (dy, dx), axis=(2, 3))
                if dy == 1:
                    xb[:, :, 0, :] = -0.5
                elif dy == -1:
                    xb[:, :, -1, :] = -0.5
                if dx == 1:
                    xb[:, :, :, 0] = -0.5
                elif dx == -1:
                    xb[:, :, :, -1] = -0.5
            logits, cache = forward(p, xb)
            loss, dl = softmax_xent(logits, y[idx])
            tot_loss += loss * len(idx)
            run_mu = 0.9 * run_mu + 0.1 * cache["mu"]
            run_var = 0.9 * run_var + 0.1 * cache["var"]
            gr = backward(p, cache, dl)
            t += 1
            cur_lr = lr * 0.5 * (1 + np.cos(np.pi * (t - 1) / total))
            for k in p:
                g = gr[k] + (wd * p[k] if k.endswith(".w") else 0)
                mom_m[k] = b1 * mom_m[k] + (1 - b1) * g
                mom_v[k] = b2 * mom_v[k] + (1 - b2) * g * g
                mh = mom_m[k] / (1 - b1 ** t)
                vh = mom_v[k] / (1 - b2 ** t)
                p[k] = (p[k] - cur_lr * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
        if (ep + 1) % 10 == 0 or ep == 0:
            acc = (predict(p, x, (run_mu, run_var)).argmax(1) == y).mean()
            log(f"epoch {ep + 1:3d}  loss {tot_loss / len(x):.4f}  train acc (running BN) {acc:.4f}")
    return p, (run_mu, run_var)


# ---------------------------------------------------------------- export

def build_onnx(p, bn_stats):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def init(name, arr):
        return numpy_helper.from_array(np.ascontiguousarray(arr, dtype=np.float32), name)

    mean, var = bn_stats
    inits = [
        init("conv1.weight", p["conv1.w"]),
        init("bn1.scale", p["bn1.scale"]), init("bn1.bias", p["bn1.bias"]),
        init("bn1.running_mean", mean), init("bn1.running_var", var),
        init("dwconv.weight", p["dw.w"]), init("dwconv.bias", p["dw.b"]),
        init("conv3.weight", p["conv3.w"]), init("conv3.bias", p["conv3.b"]),
        init("clip.min", np.array(0.0)), init("clip.max", np.array(6.0)),
        init("fc.weight", p["fc.w"]), init("fc.bias", p["fc.b"]),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.weight"], ["conv1_out"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization",
                         ["conv1_out", "bn1.scale", "bn1.bias", "bn1.running_mean", "bn1.running_var"],
                         ["bn1_out"], name="bn1", epsilon=BN_EPS, momentum=0.9),
        helper.make_node("Relu", ["bn1_out"], ["relu1_out"], name="relu1"),
        helper.make_node("Conv", ["relu1_out", "dwconv.weight", "dwconv.bias"], ["dwconv_out"],
                         name="dwconv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1],
                         group=C1),
        helper.make_node("Relu", ["dwconv_out"], ["relu2_out"], name="relu2"),
        helper.make_node("Add", ["relu1_out", "relu2_out"], ["add_out"], name="residual_add"),
        helper.make_node("MaxPool", ["add_out"], ["pool_out"], name="maxpool",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool_out", "conv3.weight", "conv3.bias"], ["conv3_out"],
                         name="conv3", kernel_shape=[K3, K3], pads=[K3 // 2] * 4, strides=[1, 1]),
        helper.make_node("Clip", ["conv3_out", "clip.min", "clip.max"], ["clip_out"], name="relu6"),
        helper.make_node("GlobalAveragePool", ["clip_out"], ["gap_out"], name="gap"),
        helper.make_node("Flatten", ["gap_out"], ["flat_out"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat_out", "fc.weight", "fc.bias"], ["logits"], name="fc",
                         transB=1),
    ]
    graph = helper.make_graph(
        nodes, "ppqlike_demo_digits_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NCLS])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="ppqlike tools/train_demo_model.py")
    model.ir_version = 10
    model.doc_string = ("Small CNN for 8x8 handwritten digits (UCI optical digits via scikit-learn). "
                        f"Input 'image' float32 [N,1,8,8] = {PREPROCESS} of raw 0..16 pixels; "
                        "output 'logits' [N,10].")
    helper.set_model_props(model, {
        "ppqlike.preprocess": PREPROCESS,
        "ppqlike.input_range": "raw pixels x in 0..16 (uint8)",
        "ppqlike.dataset": "UCI optical handwritten digits, 8x8 (sklearn.datasets.load_digits); "
                           "ppqlike/data/digits.npz",
        "ppqlike.labels": "0,1,2,3,4,5,6,7,8,9",
    })
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(DATA_DIR, "digits.npz"))
    ap.add_argument("--out", default=os.path.join(DATA_DIR, "demo_model.onnx"))
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extract-data", action="store_true",
                    help="re-create --data from scikit-learn and exit")
    args = ap.parse_args(argv)
    if args.extract_data:
        extract_data(args.data)
        print(f"wrote {args.data} ({os.path.getsize(args.data)} bytes)")
        return 0

    d = np.load(args.data)
    x = preprocess(d["images"])
    y = d["labels"]
    tr, te, ca = d["train_index"], d["test_index"], d["calibration_index"]
    print(f"data: {len(y)} images; train {len(tr)}, calibration {len(ca)} (subset of train), test {len(te)}")

    t0 = time.perf_counter()
    p, _ema = train(x[tr], y[tr], args.epochs, args.seed)
    bn_stats = bn_population_stats(p, x[tr])
    t_train = time.perf_counter() - t0
    print(f"training time: {t_train:.1f} s ({args.epochs} epochs)")
    print(f"BN running mean: {np.round(bn_stats[0], 3)}")
    print(f"BN running var:  {np.round(bn_stats[1], 3)}")

    np_logits = predict(p, x[te], bn_stats)
    acc_np = (np_logits.argmax(1) == y[te]).mean()
    print(f"numpy forward:  train acc {(predict(p, x[tr], bn_stats).argmax(1) == y[tr]).mean():.4f}  "
          f"test acc {acc_np:.4f}")

    import onnx
    import onnxruntime as ort
    model = build_onnx(p, bn_stats)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    onnx.save(model, args.out)
    sess = ort.InferenceSession(args.out, providers=["CPUExecutionProvider"])
    ort_logits = sess.run(["logits"], {"image": x[te]})[0]
    acc_ort = (ort_logits.argmax(1) == y[te]).mean()
    maxdiff = np.abs(ort_logits - np_logits).max()
    print(f"onnxruntime:    test acc {acc_ort:.4f}  (max |logit diff| vs numpy {maxdiff:.2e})")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")

    ok = True
    if acc_ort != acc_np or maxdiff > 1e-3:
        print("ERROR: onnxruntime and numpy forward passes disagree", file=sys.stderr)
        ok = False
    if acc_ort < 0.95:
        print("ERROR: test accuracy below 0.95", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
