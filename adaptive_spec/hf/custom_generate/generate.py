"""adaptive-spec's ``custom_generate`` for transformers: lossless speculative decoding with ``assistant_model``.

Loaded by ``model.generate(..., custom_generate=adaptive_spec.custom_generate_dir(),
trust_remote_code=True, assistant_model=draft)``; see :mod:`adaptive_spec.hf`.
"""

from adaptive_spec.hf import speculative_generate


def generate(model, *args, **kwargs):
    """``model.generate`` with adaptive-spec's speculative decoding (target ``model``, draft ``assistant_model``)."""
    return speculative_generate(model, *args, **kwargs)
