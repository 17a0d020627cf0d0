"""Bytes in, pixels out, on the CPU: ``probe``/``decode``/``decode_batch``, the native engine
wrapper and the Pillow fallback for non-JPEG files. Nothing here imports torch."""
