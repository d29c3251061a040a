"""The local rehearsal: a stack's etcd clusters run for real on this machine, from the very
artefacts `pulumi up` would deliver.

- `addresses`: each Azure address of the VNet gets its own loopback address (10.A.B.C ->
  127.A.B.C), so every member keeps the standard ports, like separate hosts;
- `pki`: the project's trust layout (kilonode.plan.pki) issued with `cryptography` into the
  state directory;
- `units`: the rendered units' ExecStart, parsed and mapped to loopback addresses and local
  files (nothing else changes: the flags are the renderer's);
- `etcd`: member processes (detached, PID files, logs) and what etcdctl says about them;
- `check`: the rendered kube-apiserver etcd flags against the running clusters;
- `rehearsal`: `up`, `status` and `down` as the CLI runs them (kilonode.cli.local).

It composes the renderers and (later) the image pipeline, so it sits in the last layer,
beside the CLI.
"""
