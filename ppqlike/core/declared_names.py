"""Names an object declares, and the error for one it does not.

A misspelled setting (``setting.smoothquant = True``), attribute or keyword option is refused before
anything runs, naming the closest declared names (difflib), instead of being stored where nothing reads it.

* :func:`unknown_name_error` builds that error (one message format for every caller);
* :class:`DeclaredAttributes` is a mixin whose ``__setattr__`` refuses public attributes its class does not
  declare (names starting with ``_`` pass unchecked);
* :func:`refuse_unknown_keywords` refuses the keywords a function or constructor does not take, also where
  it takes ``**kwargs`` for a known list of extra keywords.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Callable, Collection, Iterable

from .errors import UnknownKeywordError, UnknownSettingError

__all__ = ["closest_names", "unknown_name_error", "DeclaredAttributes", "refuse_unknown_keywords"]


def closest_names(name: str, known: Iterable[str], count: int = 3) -> list[str]:
    """Up to ``count`` names of ``known`` that look like ``name``, closest first."""
    return difflib.get_close_matches(str(name), sorted(set(known)), n=count, cutoff=0.6)


def unknown_name_error(said: str, unknown: Collection[str], known: Iterable[str], noun: str = "attributes",
                       hint: str = "", error: type[UnknownSettingError] = UnknownSettingError) -> UnknownSettingError:
    """An ``error`` whose message is ``said`` (e.g. "QuantizationSetting has no attribute 'smoothquant'"), the
    closest ``known`` names to each of ``unknown``, the list of ``known`` (the valid ``noun``) and ``hint``."""
    unknown, known = list(unknown), sorted(set(known))
    sentences = []
    for name in unknown:
        close = closest_names(name, known)
        if close:
            target = f" for {name!r}" if len(unknown) > 1 else ""
            sentences.append(f"did you mean {' or '.join(map(repr, close))}{target}?")
    sentences.append(f"valid {noun} are {known}" if known else f"there are no valid {noun}")
    raised = error(f"{said}; {' '.join(sentences)}{hint}")
    raised.name = unknown[0] if unknown else None  # as Python's AttributeError says which name
    return raised


class DeclaredAttributes:
    """Mixin: assigning a public attribute the class does not declare raises UnknownSettingError (an
    AttributeError) naming the closest declared ones.  Subclasses override :meth:`_declared_attributes`;
    ``_attribute_hint`` is added to the message.  Names starting with ``_`` are not checked, and reading an
    attribute is untouched."""

    __slots__ = ()
    _attribute_hint = ""

    def _declared_attributes(self) -> Collection[str]:
        """The public attributes an instance may be assigned."""
        return ()

    def _attribute_owner(self) -> str:
        """How the message names the object."""
        return type(self).__name__

    def _unknown_attribute(self, name: str) -> UnknownSettingError:
        return unknown_name_error(f"{self._attribute_owner()} has no attribute {name!r}", [name],
                                  self._declared_attributes(), hint=self._attribute_hint)

    def _check_declared(self, name: str) -> None:
        """Raise the error for ``name`` unless it is declared or private."""
        if not name.startswith("_") and name not in self._declared_attributes():
            raise self._unknown_attribute(name)

    def __setattr__(self, name: str, value) -> None:
        self._check_declared(name)
        super().__setattr__(name, value)


@functools.lru_cache(maxsize=None)
def _keyword_parameters(function: Callable) -> tuple[frozenset[str], bool]:
    """(the names ``function`` takes as keywords, whether it takes ``**kwargs``); ``self`` is left out."""
    if function is object.__init__:  # a class without its own __init__ takes no keywords
        return frozenset(), False
    parameters = inspect.signature(function).parameters.values()
    names = frozenset(p.name for p in parameters
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self")
    return names, any(p.kind is p.VAR_KEYWORD for p in parameters)


def refuse_unknown_keywords(function: Callable, given: Iterable[str], owner: str,
                            accepted: Iterable[str] | None = None,
                            error: type[UnknownSettingError] = UnknownKeywordError) -> None:
    """Raise ``error`` (an UnknownKeywordError: also a TypeError) naming the keywords of ``given`` that
    ``function`` does not take and the closest ones it does; ``owner`` names the call in the message.

    A function with ``**kwargs`` takes any keyword, unless ``accepted`` lists the ones its ``**kwargs``
    take besides its named parameters.
    """
    given = list(given)
    if not given:
        return
    names, takes_any = _keyword_parameters(function)
    if takes_any and accepted is None:
        return
    known = names | frozenset(accepted or ())
    unknown = [name for name in given if name not in known]
    if unknown:
        said = (f"{owner} got an unknown keyword {unknown[0]!r}" if len(unknown) == 1
                else f"{owner} got unknown keywords {unknown}")
        raise unknown_name_error(said, unknown, known, noun="keywords", error=error)
