"""The demos (`deviceplugin demo`, `deviceplugin dra demo`): a daemon on a simulated node run
against the emulators of its kubelet and API server. Composition, not daemon code: a demo
wires a daemon to `sim`'s emulators, which the daemon itself never needs, so it sits with the
top level and follows its rules.

May import everything of the package; nothing below the top level imports it.
"""
