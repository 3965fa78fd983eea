"""The simulated world, a product feature (demo, CI, laptops): a stand-in for the `pynvml`
module built from a node description or preset (`fake_nvml` over `world`, `node`, `profiles`,
`structs`), the reader of the simulated-events file (`events`), a simulated host's driver files
(`hostroot`), emulators of the kubelet's device-plugin, pod-resources and plugin-watcher
(DRA registration) endpoints (`kubelet`, `podresources`, `pluginwatcher`), and a stand-in for
the API server's `resource.k8s.io/v1` ResourceSlice and ResourceClaim endpoints (`apiserver`).

May import `wire`, `model`, `node` and `sim`: an emulator speaks the kubelet's APIs from their
stubs, never from the code that serves them.
"""
