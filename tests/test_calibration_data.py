"""ppqlike.io.calibration_data: folders of images or arrays as lazily loading, re-iterable batches."""

import os

import numpy as np
import pytest

from ppqlike.core.errors import CalibrationDataError, PPQLikeError
from ppqlike.io import calibration_data
from ppqlike.io.calibration_data import CalibrationDataWarning, CalibrationFolder, InputSpec
from ppqlike.io.calibration_files import CalibrationFileLoader

SPEC = {"x": ["N", 2, 3]}  # one input, rank 3, batch dimension dynamic


def _folder(tmp_path, name="data"):
    folder = tmp_path / name
    folder.mkdir()
    return folder


def _all(data):
    return [np.asarray(b) for b in data]


def test_npy_samples_and_batches_regrouped(tmp_path):
    folder = _folder(tmp_path)
    values = np.arange(7 * 6, dtype=np.float32).reshape(7, 2, 3)
    np.save(folder / "a.npy", values[0])          # one sample (rank 2)
    np.save(folder / "b.npy", values[1:5])        # a batch of 4
    np.save(folder / "c.npy", values[5:7].astype(np.float64))  # a batch of 2, cast to the input's dtype
    data = CalibrationFolder(folder, SPEC, batch_size=3)
    assert (data.kind, data.samples, len(data)) == ("arrays", 7, 3)
    batches = _all(data)
    assert [b.shape[0] for b in batches] == [3, 3, 1]
    assert all(b.dtype == np.float32 for b in batches)
    np.testing.assert_array_equal(np.concatenate(batches), values)
    # iterating again gives the same batches (observers may take two passes)
    np.testing.assert_array_equal(np.concatenate(_all(data)), values)


def test_streaming_reads_only_what_a_batch_needs(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    for index in range(6):
        np.save(folder / f"s{index}.npy", np.full((2, 3), index, np.float32))
    data = CalibrationFolder(folder, SPEC, batch_size=2)  # listing reads headers only
    loaded = []
    original = CalibrationFileLoader.arrays
    monkeypatch.setattr(CalibrationFileLoader, "arrays", lambda self, name: (loaded.append(name), original(self, name))[1])
    iterator = iter(data)
    first = next(iterator)
    assert first.shape == (2, 2, 3) and loaded == ["s0.npy", "s1.npy"]
    assert len(data) == 3


def test_npz_multi_input_keyed_by_name(tmp_path):
    folder = _folder(tmp_path)
    specs = [InputSpec("a", (None, 4)), InputSpec("b", (None, 2, 2))]
    np.savez(folder / "one.npz", a=np.ones((3, 4), np.float32), b=np.zeros((3, 2, 2), np.float32))
    np.savez(folder / "two.npz", a=np.ones(4, np.float32), b=np.zeros((2, 2), np.float32))  # single sample
    data = CalibrationFolder(folder, specs, batch_size=2)
    batches = list(data)
    assert len(data) == 2 and [sorted(b) for b in batches] == [["a", "b"], ["a", "b"]]
    assert [b["a"].shape[0] for b in batches] == [2, 2] and batches[1]["b"].shape == (2, 2, 2)


def test_npz_single_input_any_key(tmp_path):
    folder = _folder(tmp_path)
    np.savez(folder / "d.npz", whatever=np.ones((5, 2, 3), np.float32))
    assert [b.shape for b in CalibrationFolder(folder, SPEC, batch_size=4)] == [(4, 2, 3), (1, 2, 3)]


@pytest.mark.parametrize("make, fragments", [
    (lambda f: np.savez(f / "d.npz", a=np.ones((1, 4)), c=np.ones((1, 2, 2))), ["d.npz'", "['a', 'c']", "['a', 'b']"]),
    (lambda f: np.save(f / "d.npy", np.ones((1, 4))), ["d.npy'", ".npz files keyed by input name"]),
    (lambda f: np.savez(f / "d.npz", a=np.ones((2, 4)), b=np.ones((3, 2, 2))), ["different numbers of samples"]),
])
def test_multi_input_errors(tmp_path, make, fragments):
    folder = _folder(tmp_path)
    make(folder)
    with pytest.raises(CalibrationDataError) as info:
        CalibrationFolder(folder, [InputSpec("a", (None, 4)), InputSpec("b", (None, 2, 2))])
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("array, fragments", [
    (np.ones((2, 2, 3, 1), np.float32), ["rank 3 (a batch) or 2 (one sample)", "[2, 2, 3, 1]"]),
    (np.ones((2, 2, 4), np.float32), ["a sample must have shape [2, 3]", "[2, 2, 4]"]),
    (np.ones(5, np.float32), ["rank 3", "[5]"]),
])
def test_wrong_rank_or_shape_names_the_file(tmp_path, array, fragments):
    folder = _folder(tmp_path)
    np.save(folder / "bad.npy", array)
    with pytest.raises(CalibrationDataError) as info:
        CalibrationFolder(folder, {"x": [None, 2, 3]})
    assert "bad.npy" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_names_the_file(tmp_path, value):
    folder = _folder(tmp_path)
    array = np.zeros((3, 2, 3), np.float32)
    array[1, 1, 2] = value
    np.save(folder / "good.npy", np.zeros((1, 2, 3), np.float32))
    np.save(folder / "poisoned.npy", array)
    data = CalibrationFolder(folder, SPEC)
    with pytest.raises(CalibrationDataError, match="poisoned.npy.*NaN or Inf"):
        list(data)


def test_empty_missing_and_file_paths(tmp_path):
    empty = _folder(tmp_path, "empty")
    with pytest.raises(CalibrationDataError, match="it is empty"):
        CalibrationFolder(empty, SPEC)
    (empty / ".hidden.npy").write_bytes(b"ignored")
    (empty / "sub").mkdir()
    with pytest.raises(CalibrationDataError, match="no images .* and no .npy/.npz files"):
        CalibrationFolder(empty, SPEC)
    with pytest.raises(CalibrationDataError, match="does not exist"):
        CalibrationFolder(tmp_path / "missing", SPEC)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(CalibrationDataError, match="is not a folder"):
        CalibrationFolder(tmp_path / "plain", SPEC)
    only_text = _folder(tmp_path, "text")
    (only_text / "notes.txt").write_text("x")
    with pytest.raises(CalibrationDataError, match="only 1 other file"):
        CalibrationFolder(only_text, SPEC)
    zero = _folder(tmp_path, "zero")
    np.save(zero / "z.npy", np.zeros((0, 2, 3), np.float32))
    with pytest.raises(CalibrationDataError, match="hold no samples"):
        CalibrationFolder(zero, SPEC)


def test_bad_batch_size_and_unreadable_file(tmp_path):
    folder = _folder(tmp_path)
    np.save(folder / "a.npy", np.zeros((1, 2, 3), np.float32))
    for size in (0, -1, 1.5, True):
        with pytest.raises(CalibrationDataError, match="batch size"):
            CalibrationFolder(folder, SPEC, batch_size=size)
    (folder / "b.npy").write_bytes(b"not numpy")
    with pytest.raises(CalibrationDataError, match="cannot read calibration file .*b.npy"):
        CalibrationFolder(folder, SPEC)


# ------------------------------------------------------------------------ images
def _images(folder, count, size=(12, 10)):
    from PIL import Image
    rng = np.random.default_rng(0)
    for index in range(count):
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{index}.png")


def test_image_folder_lazily_preprocessed_with_model_defaults(tmp_path):
    pytest.importorskip("PIL")
    from ppqlike.io.images import load_image
    folder = _folder(tmp_path)
    _images(folder, 5)
    (folder / "README.txt").write_text("not an image")
    with pytest.warns(CalibrationDataWarning, match="skipped 1 file.*README.txt"):
        data = CalibrationFolder(folder, {"x": [None, 3, 8, 8]}, batch_size=2,
                                 image_options={"mean": 127.0, "std": 128.0})
    assert (data.kind, data.samples, len(data), data.skipped) == ("images", 5, 3, ["README.txt"])
    batches = list(data)
    assert [b.shape for b in batches] == [(2, 3, 8, 8), (2, 3, 8, 8), (1, 3, 8, 8)]
    # crop defaults to the model's H x W, resize to the crop size; (x - mean) / std as in load_image
    expected = load_image(folder / "img0.png", resize_shorter=8, crop=(8, 8), mean=127.0, std=128.0)
    np.testing.assert_array_equal(batches[0][:1], expected)


def test_image_layout_inferred_and_checked(tmp_path):
    pytest.importorskip("PIL")
    folder = _folder(tmp_path)
    _images(folder, 1)
    assert next(iter(CalibrationFolder(folder, {"x": [1, 6, 6, 3]}))).shape == (1, 6, 6, 3)  # NHWC
    with pytest.raises(CalibrationDataError, match="1 channel"):
        CalibrationFolder(folder, {"x": [1, 1, 8, 8]})
    with pytest.raises(CalibrationDataError, match="cropped to 4x4 .* takes 8x8"):
        CalibrationFolder(folder, {"x": [1, 3, 8, 8]}, image_options={"crop": 4})
    with pytest.raises(CalibrationDataError, match="2 inputs"):
        CalibrationFolder(folder, {"a": [1, 3, 8, 8], "b": [1, 3, 8, 8]})


def test_mixed_folder_and_broken_image(tmp_path):
    pytest.importorskip("PIL")
    folder = _folder(tmp_path)
    _images(folder, 1)
    np.save(folder / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(CalibrationDataError, match="mixes 1 image"):
        CalibrationFolder(folder, {"x": [1, 3, 8, 8]})
    os.remove(folder / "x.npy")
    (folder / "zz.jpg").write_bytes(b"garbage")
    data = CalibrationFolder(folder, {"x": [1, 3, 8, 8]})
    with pytest.raises(PPQLikeError, match="cannot read image .*zz.jpg"):
        list(data)


def test_input_specs_from_graph():
    from ppqlike.cli.main import _data_path
    from ppqlike.io import load_onnx_graph
    specs = calibration_data.input_specs(load_onnx_graph(_data_path("demo_model.onnx")))
    assert [(s.name, s.rank) for s in specs] == [("image", 4)]
