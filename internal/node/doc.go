// Package node is kip's worker nodes: kip node add, list, remove, reboot, fence and storage, how
// the nodes reach each other, and the worker upgrades kip install runs. The record of the
// workers kip joined (kipper.run/nodes) is Nodes.
package node
