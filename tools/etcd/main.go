// Command etcd is the etcd server used by kip's test environment. It is never linked into kip.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
