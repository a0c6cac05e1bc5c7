"""The bundled demo model and data (ppqlike/data/), made by tools/train_demo_model.py."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ppqlike", "data")
MODEL = os.path.join(DATA_DIR, "demo_model.onnx")
DIGITS = os.path.join(DATA_DIR, "digits.npz")


@pytest.fixture(scope="module")
def digits():
    with np.load(DIGITS) as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def session():
    return ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])


def preprocess(images):
    return (images.astype(np.float32) / 16.0 - 0.5)[:, None, :, :]


def test_bundled_files_small():
    total = sum(os.path.getsize(os.path.join(DATA_DIR, f)) for f in os.listdir(DATA_DIR)
                if os.path.isfile(os.path.join(DATA_DIR, f)))
    assert total < 300 * 1024
    assert os.path.getsize(MODEL) < 64 * 1024


def test_data_and_split(digits):
    images, labels = digits["images"], digits["labels"]
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert images.max() == 16 and images.min() == 0
    assert labels.shape == (1797,) and labels.dtype == np.int64
    assert set(np.unique(labels)) == set(range(10))
    tr, ca, te = digits["train_index"], digits["calibration_index"], digits["test_index"]
    assert (len(tr), len(ca), len(te)) == (1200, 200, 597)
    assert len(np.intersect1d(tr, te)) == 0
    assert np.array_equal(np.union1d(tr, te), np.arange(1797))
    assert np.isin(ca, tr).all() and len(np.unique(ca)) == 200


def test_model_checks_and_structure():
    onnx.checker.check_model(MODEL, full_check=True)
    m = onnx.load(MODEL)
    assert m.ir_version == 10
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 13)]
    props = {p.key: p.value for p in m.metadata_props}
    assert props["ppqlike.preprocess"] == "x / 16 - 0.5"
    ops = [n.op_type for n in m.graph.node]
    for op in ("Conv", "BatchNormalization", "Relu", "Add", "MaxPool", "Clip",
               "GlobalAveragePool", "Flatten", "Gemm"):
        assert op in ops
    assert any(a.name == "group" and a.i == 16 for n in m.graph.node if n.op_type == "Conv"
               for a in n.attribute)
    (inp,), (out,) = m.graph.input, m.graph.output
    assert inp.name == "image" and out.name == "logits"
    assert inp.type.tensor_type.shape.dim[0].dim_param == "N"
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim[1:]] == [1, 8, 8]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    scale, bias, mean, var = (inits[name] for name in bn.input[1:])
    # real running statistics, not an identity BN
    assert not np.allclose(mean, 0) and not np.allclose(var, 1)
    assert not np.allclose(scale, 1) and (var > 0).all()


def test_test_split_accuracy(digits, session):
    te = digits["test_index"]
    logits = session.run(["logits"], {"image": preprocess(digits["images"][te])})[0]
    assert logits.shape == (len(te), 10) and logits.dtype == np.float32
    acc = (logits.argmax(1) == digits["labels"][te]).mean()
    assert acc >= 0.95, acc


def test_dynamic_batch(digits, session):
    x = preprocess(digits["images"][digits["calibration_index"][:7]])
    full = session.run(["logits"], {"image": x})[0]
    single = np.concatenate([session.run(["logits"], {"image": x[i:i + 1]})[0] for i in range(7)])
    np.testing.assert_allclose(single, full, rtol=1e-5, atol=1e-5)
