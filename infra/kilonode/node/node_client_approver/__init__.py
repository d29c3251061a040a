"""The node client certificate approver: approves a joining kubelet's first client certificate
only for a name its pool's scale sets can give a VM (kilonode.node.node_client_approver.rules),
in place of kube-controller-manager's blanket approval for every bootstrap token. Runs beside
each apiserver (kilonode.render.control_plane), from the control-plane image (kilonode.node.ship)."""
