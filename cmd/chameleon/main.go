// Command chameleon plans swaps from recorded operator traces: it detects
// sequence changes, profiles memory and time, plans and simulates swap
// policies, and replays traces through the Engine on the host backend.
//
//	chameleon detect  --trace FILE [--rounds R] [--json]
//	chameleon profile --trace FILE [--iter K] [--groups N] [--json]
//	chameleon plan    --trace FILE [--iter K] --limit 12GiB|70% [--json] ...
//	chameleon replay  --trace FILE --limit 80% [--scale N] [--rounds R] [--json]
//
// Every command takes -h. A limit is a share of the peak in (0%, 100%] or
// bytes with a unit (12GiB, 12GB, 12e9B). Exit status: 0 done, 1 the work
// failed (plan: also a limit no plan meets, after its report, --json too),
// 2 a bad command line. --json output is documented in docs/json.md.
//
// Install: go install github.com/chameleon-go/chameleon/cmd/chameleon@latest
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is one subcommand. run gets the arguments after the subcommand
// name and writes its report to stdout; progress and diagnostics go to stderr.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

// register adds a subcommand; each lives in its own file.
func register(name, summary string, run func(args []string, stdout, stderr io.Writer) error) {
	commands[name] = command{summary: summary, run: run}
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, versionLine())
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "chameleon: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	err := cmd.run(args[1:], stdout, stderr)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errFlag): // the flag package printed it
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "chameleon %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "chameleon %s: %v\n", args[0], err)
	return 1
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: chameleon <command> [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(&b, "  %-8s %s\n", "version", "print the build: module version, commit, whether the tree was modified, Go version")
	b.WriteString("\nRun 'chameleon <command> -h' for a command's flags.\n")
	io.WriteString(w, b.String())
}
