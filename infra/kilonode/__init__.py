"""kilonode: stack config -> cluster plan -> rendered artefacts, Pulumi components, images."""
