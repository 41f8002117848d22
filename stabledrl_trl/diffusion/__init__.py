"""Masked-diffusion language-model utilities."""
