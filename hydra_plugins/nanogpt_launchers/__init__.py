"""nanogpt's Hydra launchers, where Hydra looks for plugins (the `hydra_plugins` namespace
package: no __init__.py above this one). The implementations live in nanogpt/frontend/launchers/."""
