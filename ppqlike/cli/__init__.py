"""The ``ppqlike`` command line: ``quantize`` (:mod:`.quantize`), ``demo`` (:mod:`.main`), output folders
and summaries (:mod:`.output`), export (:mod:`.export`)."""

from .main import build_parser, load_demo_data, main

__all__ = ["main", "build_parser", "load_demo_data"]
