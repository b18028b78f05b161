"""Keyword arguments renamed in a public function: the old keyword keeps working for one release.

One name per idea (docs/architecture.md, "The parallel functions' API"): ``micro_batches`` is a count of
micro-batches everywhere, ``virtual_stages`` a count of model chunks per pipeline rank. A function
whose keyword was renamed is decorated with :func:`renamed_keywords`; a caller that still passes the
old keyword gets the call done and a ``DeprecationWarning`` naming the new keyword.
"""
from __future__ import annotations

import functools
import warnings


def renamed_keywords(**old_to_new: str):
    """Decorator: accept each old keyword (``old=new``) for one release, passing its value as the new
    keyword, with a ``DeprecationWarning`` that names the new one.

    Raises (at call time):
        TypeError: both the old and the new keyword given.
    """
    def decorate(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got {old}= and {new}=; pass {new}= only ({old} is its "
                                        f"former name)")
                    warnings.warn(f"{fn.__name__}({old}=...) is deprecated and will be removed in the next release; "
                                  f"pass {new}=...", DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return call
    return decorate
