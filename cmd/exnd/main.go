package main

import (
	"os"

	"github.com/exn-project/exn/cmd/exnd/internal/daemon"
)

func main() { os.Exit(daemon.Main(os.Args[1:], os.Stderr)) }
