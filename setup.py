"""Packaging beyond what pyproject.toml can say: conf/ and sweeps/ stay at the top of the
checkout, and a wheel carries them inside the package, as nanogpt/conf and nanogpt/sweeps
(nanogpt/frontend/presets.py finds either). The packages are found, not listed, so a new one
needs no entry here."""

from setuptools import find_namespace_packages, find_packages, setup

DATA = {"nanogpt.conf": "conf", "nanogpt.sweeps": "sweeps"}  # package -> dir of the checkout
data_packages = [
    f"{package}.{sub}" if sub else package
    for package, folder in DATA.items()
    for sub in ["", *find_namespace_packages(folder)]
]
# Hydra finds launchers and sweepers only in the hydra_plugins namespace (no __init__.py there):
# hydra/launcher=parallel|slurm, hydra/sweeper=tune
plugin_packages = ["hydra_plugins.nanogpt_launchers", "hydra_plugins.nanogpt_tune"]

setup(
    packages=[
        *find_packages(include=["nanogpt", "nanogpt.*"]),
        *data_packages,
        *plugin_packages,
    ],
    package_dir=DATA,
)
