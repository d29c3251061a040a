"""The node image: build (recipe + pool artefacts -> GPT/UEFI disk, VHD, manifest) and
verify (boot it in qemu with a NoCloud seed and run the testinfra suite in node-image/verify).
"""
