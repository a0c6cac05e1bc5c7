"""The command line on models of any input size: dynamic height/width take their size from the options or
stop with one line naming the input and the option, before any image is read; --letterbox (YOLO's
preprocessing) checked pixel by pixel against a hand computation; --crop alone resizes first, as --help
says; an op the executor cannot run is named at load time, in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model
from ppqlike.cli.main import main
from ppqlike.core.errors import CalibrationDataError, PPQLikeError, UnsupportedOperationError

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def detector_model(path, height="height", width="width", extra_nodes=(), opsets=()) -> str:
    """images [N, 3, height, width] -> Conv 3x3 -> Relu -> Conv 1x1 -> y [N, 4, height, width] (a detector's
    dense head, any input size); ``extra_nodes`` are appended after y (they read 'y')."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w1"),
                 numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
                 numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.3, "w2")]
    nodes = [helper.make_node("Conv", ["images", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="head"), *extra_nodes]
    output = extra_nodes[-1].output[0] if extra_nodes else "y"
    model = make_model(nodes, [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, height, width])],
                       [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", 4, height, width])], constants)
    for domain, version in opsets:
        model.opset_import.append(helper.make_opsetid(domain, version))
    onnx.save(model, str(path))
    return str(path)


def photo_folder(folder, sizes) -> str:
    """JPEG-free (PNG) 'photos' of the given (width, height) sizes, random pixels."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    for index, (width, height) in enumerate(sizes):
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(folder / f"p{index}.png")
    return str(folder)


MIXED = [(40, 30), (24, 36), (50, 50), (30, 20)]


@pytest.fixture()
def no_pixels_read(monkeypatch):
    """Fails the test if any calibration image is decoded (headers may be read)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a calibration image was read")
    monkeypatch.setattr("ppqlike.io.calibration_files.load_image", refuse)


# ------------------------------------------------------------------------------------- dynamic sizes
def test_dynamic_size_without_a_size_option_names_the_input_and_the_options(tmp_path, capsys, no_pixels_read):
    model = detector_model(tmp_path / "det.onnx")
    calib = photo_folder(tmp_path / "photos", MIXED)
    code, out, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out", "--scale", 255)
    assert code == 2 and err.count("\n") == 1 and err.startswith("ppqlike: error: "), err
    for fragment in ("model input 'images'", "['N', 3, 'height', 'width']", "no fixed height and width",
                     "4 sizes", "--letterbox N", "--crop N", "--input-shape 1,3,H,W"):
        assert fragment in err, (fragment, err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # --letterbox without a size on such a model: the size is what is missing, said so
    code, _, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out", "--letterbox")
    assert code == 2 and "model input 'images'" in err and "the letterbox needs a size: pass --letterbox N" in err
    code, _, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out", "--letterbox", 32,
                        "--crop", 32)
    assert code == 2 and "--letterbox replaces --resize and --crop" in err


def _calibration_seen(monkeypatch):
    """Records the batches the quantization draws (shapes and values)."""
    import ppqlike.cli.quantize as cli_quantize
    seen = []
    original = cli_quantize.open_calibration

    def recording(*args, **kwargs):
        data = original(*args, **kwargs)
        seen.append(data)
        return data
    monkeypatch.setattr(cli_quantize, "open_calibration", recording)
    return seen


@pytest.mark.parametrize("options, expected", [
    (["--crop", 32], {"resize_shorter": 32, "crop": 32}),              # --resize defaults to the crop, as --help says
    (["--crop", "24x32", "--resize", 40], {"resize_shorter": 40, "crop": (24, 32)}),
    (["--letterbox", 32], {"letterbox": 32, "resize_shorter": None, "crop": None}),
    (["--letterbox", "24x40", "--letterbox-value", "0,128,255"],
     {"letterbox": (24, 40), "letterbox_value": (0, 128, 255), "resize_shorter": None, "crop": None}),
    (["--input-shape", "1,3,32,32"], {"resize_shorter": 32, "crop": 32}),
    (["--input-shape", "1,3,32,32", "--letterbox"], {"letterbox": 32, "resize_shorter": None, "crop": None}),
], ids=["crop", "crop-resize", "letterbox", "letterbox-rect-value", "input-shape", "input-shape-letterbox"])
def test_dynamic_size_from_the_options(tmp_path, capsys, monkeypatch, options, expected):
    from ppqlike.io.images import load_image
    model = detector_model(tmp_path / "det.onnx")
    calib = photo_folder(tmp_path / "photos", MIXED)
    seen = _calibration_seen(monkeypatch)
    code, out, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out", "--scale", 255,
                          "--platform", "ort_int8", "--batch-size", 2, "--quiet", *options)
    assert code == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["calibration"]["samples"] == 4
    first = next(iter(seen[0]))
    for index in range(2):
        reference = load_image(f"{calib}/p{index}.png", scale=255, **expected)
        np.testing.assert_array_equal(first[index:index + 1], reference)


def test_dynamic_size_with_images_of_one_size_needs_no_option(tmp_path, capsys):
    model = detector_model(tmp_path / "det.onnx")
    calib = photo_folder(tmp_path / "photos", [(20, 16)] * 3)
    code, _, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out", "--quiet",
                        "--platform", "ort_int8")
    assert code == 0, err


def test_crop_alone_on_a_fixed_size_model_resizes_first(tmp_path, capsys, monkeypatch):
    # --help: "--resize ... (default: the crop's larger side)": images smaller than the crop are resized up
    model = detector_model(tmp_path / "fixed.onnx", 32, 32)
    calib = photo_folder(tmp_path / "photos", [(20, 16), (16, 24)])
    seen = _calibration_seen(monkeypatch)
    code, _, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out", "--quiet",
                        "--crop", 32, "--platform", "ort_int8")
    assert code == 0, err
    from ppqlike.io.images import load_image
    np.testing.assert_array_equal(next(iter(seen[0]))[:1],
                                  load_image(f"{calib}/p0.png", resize_shorter=32, crop=32))
    code, out, _ = _run(capsys, "quantize", "--help")
    assert code == 0 and "(default: the crop's larger side)" in " ".join(out.split())
    assert "--letterbox" in out and "--letterbox-value" in out


def test_dynamic_size_arrays_of_several_shapes_in_one_batch_are_refused_from_their_headers(tmp_path, capsys,
                                                                                            monkeypatch):
    from ppqlike.io.calibration_data import CalibrationFolder
    folder = tmp_path / "arrays"
    folder.mkdir()
    rng = np.random.default_rng(3)
    np.save(folder / "a.npy", rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    np.save(folder / "b.npy", rng.standard_normal((3, 8, 8)).astype(np.float32))      # one sample
    np.save(folder / "c.npy", rng.standard_normal((1, 3, 10, 12)).astype(np.float32))
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("an array was read"))
    spec = {"images": ["N", 3, "height", "width"]}
    with pytest.raises(CalibrationDataError, match=r"input 'images' .*a.npy \[3, 8, 8\], b.npy \[3, 8, 8\], "
                                                   r"c.npy \[3, 10, 12\].*--batch-size 1"):
        CalibrationFolder(folder, spec, batch_size=4)
    assert len(CalibrationFolder(folder, spec, batch_size=3)) == 2   # [a, a, b] and [c]: one shape each
    with pytest.raises(CalibrationDataError, match="c.npy"):
        CalibrationFolder(folder, spec, batch_size=2)                  # [a, a], [b, c]
    model = detector_model(tmp_path / "det.onnx")
    code, _, err = _run(capsys, "quantize", model, "--calib", folder, "--out", tmp_path / "out", "--batch-size", 4)
    assert code == 2 and err.count("\n") == 1 and "would share a batch of 4" in err


# ------------------------------------------------------------------------------------------ letterbox
def _save(path, pixels) -> str:
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(path)
    return str(path)


def test_letterbox_pixels_by_hand(tmp_path):
    from ppqlike.io.images import load_image
    rng = np.random.default_rng(2)
    # no scaling (ratio 1): a 5 wide x 2 high image in a 5x5 box; pad 3 rows: 1 above (round(1.5 - 0.1)), 2 below
    wide = rng.integers(0, 256, (2, 5, 3), dtype=np.uint8)
    got = load_image(_save(tmp_path / "wide.png", wide), resize_shorter=None, crop=None, letterbox=5, layout="NHWC")
    expected = np.full((5, 5, 3), 114, np.float32)
    expected[1:3] = wide
    np.testing.assert_array_equal(got[0], expected)
    # the tall one: 1 column left, 2 right; per-channel pad values in the output (BGR) order, then normalised
    tall = rng.integers(0, 256, (5, 2, 3), dtype=np.uint8)
    got = load_image(_save(tmp_path / "tall.png", tall), resize_shorter=None, crop=None, letterbox=5, bgr=True,
                     letterbox_value=(1, 2, 3), scale=255, mean=0.5, std=0.25)
    expected = np.empty((5, 5, 3), np.float32)
    expected[...] = (1, 2, 3)
    expected[:, 1:3] = tall[..., ::-1]
    np.testing.assert_allclose(got[0], ((expected / 255 - 0.5) / 0.25).transpose(2, 0, 1), rtol=0, atol=1e-6)
    # scaled: a constant 6 wide x 3 high image in a 12x12 box, ratio min(12/3, 12/6) = 2 -> 12 x 6, 3 rows of pad
    # above and below; in a 4 x 8 (h x w) box, ratio min(4/3, 8/6) = 4/3 -> 8 x 4 fills it exactly
    flat = np.empty((3, 6, 3), np.uint8)
    flat[...] = (10, 200, 60)
    path = _save(tmp_path / "flat.png", flat)
    got = load_image(path, resize_shorter=None, crop=None, letterbox=12, layout="NHWC")[0]
    assert got.shape == (12, 12, 3)
    np.testing.assert_array_equal(got[:3], 114)
    np.testing.assert_array_equal(got[9:], 114)
    np.testing.assert_array_equal(got[3:9], np.broadcast_to(np.float32([10, 200, 60]), (6, 12, 3)))
    got = load_image(path, resize_shorter=None, crop=None, letterbox=(4, 8), layout="NHWC")[0]
    np.testing.assert_array_equal(got, np.broadcast_to(np.float32([10, 200, 60]), (4, 8, 3)))
    # the scaled image is Pillow's bilinear resize of the whole image, centred
    photo = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)   # 40 wide, 30 high -> 32 x 24 in a 32x32 box
    got = load_image(_save(tmp_path / "photo.png", photo), resize_shorter=None, crop=None, letterbox=32,
                     layout="NHWC")[0]
    resized = np.asarray(Image.fromarray(photo).resize((32, 24), Image.BILINEAR), np.float32)
    np.testing.assert_array_equal(got[4:28], resized)
    np.testing.assert_array_equal(got[:4], 114)
    np.testing.assert_array_equal(got[28:], 114)
    # load_image's default resize and crop give way to a letterbox; given explicitly, they are refused
    np.testing.assert_array_equal(load_image(path, letterbox=(4, 8)),
                                  load_image(path, resize_shorter=None, crop=None, letterbox=(4, 8)))
    with pytest.raises(PPQLikeError, match="letterbox=5 replaces resizing and cropping"):
        load_image(path, letterbox=5, crop=4)


def test_letterbox_on_a_fixed_size_model_takes_its_size(tmp_path):
    from ppqlike.io.calibration_data import CalibrationFolder
    from ppqlike.io.images import load_image
    calib = photo_folder(tmp_path / "photos", MIXED)
    data = CalibrationFolder(calib, {"images": [1, 3, 24, 40]}, batch_size=4,
                             image_options={"letterbox": True, "letterbox_value": [114.0]})
    batch = next(iter(data))
    assert batch.shape == (4, 3, 24, 40)
    np.testing.assert_array_equal(batch[1:2], load_image(f"{calib}/p1.png", resize_shorter=None, crop=None,
                                                         letterbox=(24, 40)))
    with pytest.raises(CalibrationDataError, match="letterboxed to 32x32 .* takes 24x40"):
        CalibrationFolder(calib, {"images": [1, 3, 24, 40]}, image_options={"letterbox": 32})


# ----------------------------------------------------------------------------------- unsupported ops
def test_an_op_the_executor_cannot_run_is_named_at_load_in_one_line(tmp_path, capsys, no_pixels_read):
    extra = [helper.make_node("FusedGemmLike", ["y"], ["z"], name="custom_head", domain="com.example"),
             helper.make_node("RandomNormalLike", ["z"], ["noise"], name="noise"),
             helper.make_node("Add", ["z", "noise"], ["out"], name="add")]
    model = detector_model(tmp_path / "custom.onnx", extra_nodes=extra, opsets=[("com.example", 1)])
    calib = photo_folder(tmp_path / "photos", MIXED)  # no size option either: the op is said first
    code, _, err = _run(capsys, "quantize", model, "--calib", calib, "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1, err
    assert "node 'custom_head' has op type 'FusedGemmLike' of domain 'com.example'" in err
    assert "1 other node(s) cannot run either (op types RandomNormalLike)" in err
    assert len(err) < 400 and "Conv, " not in err  # no list of every op the executor implements

    class Untouchable:
        def __len__(self):
            return 1

        def __iter__(self):
            raise AssertionError("the calibration data was read")
    import ppqlike
    with pytest.raises(UnsupportedOperationError, match="custom_head"):
        ppqlike.quantize_onnx_model(model, Untouchable(), platform="ort_int8")
