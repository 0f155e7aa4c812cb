package cli

import (
	"fmt"
	"os"
	"sync"

	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
)

// Output formats for -o.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// GlobalOptions are bound to the root command's persistent flags.
type GlobalOptions struct {
	Cluster    string // --cluster, or KIP_CLUSTER
	Kubeconfig string // --kubeconfig
	Context    string // --context
	SSHKey     string // --ssh-key
	SSHUser    string // --ssh-user
	SSHUserSet bool   // --ssh-user was given, so it overrides a saved user and ~/.ssh/config
	Yes        bool   // --yes
	Output     string // -o/--output
	Verbose    int    // -v, repeatable
}

// Validate checks what flag parsing cannot.
func (g *GlobalOptions) Validate() error {
	switch g.Output {
	case OutputText, OutputJSON:
		return nil
	default:
		return Usagef("invalid --output %q: use text or json", g.Output)
	}
}

// Factory gives commands what they need, built on first use: nothing here dials a host or an
// API server until a command asks for it, so --help and flag errors never connect anywhere.
type Factory struct {
	IO     *IOStreams
	Global GlobalOptions
	// Args is the command line after "kip" (nil: os.Args[1:]), for CommandLine.
	Args []string

	once     sync.Once
	printer  *Printer
	prompter *Prompter

	kubeOnce sync.Once
	kube     *kube.Clients
	kubeErr  error
	ssh      sshx.Pool
}

// NewFactory returns a factory on the given streams.
func NewFactory(io *IOStreams) *Factory { return &Factory{IO: io} }

func (f *Factory) init() {
	f.once.Do(func() {
		f.printer = NewPrinter(f.IO)
		f.prompter = NewPrompter(f.IO, f.Global.Yes)
	})
}

// Printer returns the one printer of this invocation.
func (f *Factory) Printer() *Printer { f.init(); return f.printer }

// Prompter returns the prompter; it honours --yes.
func (f *Factory) Prompter() *Prompter { f.init(); return f.prompter }

// ConfigStore returns the local configuration store.
func (f *Factory) ConfigStore() (config.Store, error) {
	dir, err := config.Dir()
	if err != nil {
		return config.Store{}, err
	}
	return config.Store{Dir: dir}, nil
}

// ClusterName returns the cluster chosen by --cluster or KIP_CLUSTER ("" for the default).
func (f *Factory) ClusterName() string {
	if f.Global.Cluster != "" {
		return f.Global.Cluster
	}
	return f.IO.Getenv("KIP_CLUSTER")
}

// SSHKeyPath resolves the SSH key: --ssh-key, then KIP_SSH_KEY, then the cluster's saved key.
// An empty result leaves the choice to ~/.ssh/config's IdentityFile and then ssh-agent.
func (f *Factory) SSHKeyPath(saved *config.Cluster) string {
	switch {
	case f.Global.SSHKey != "":
		return f.Global.SSHKey
	case f.IO.Getenv("KIP_SSH_KEY") != "":
		return f.IO.Getenv("KIP_SSH_KEY")
	case saved != nil:
		return saved.SSHKey
	default:
		return ""
	}
}

// Debugf prints a diagnostic line through the printer when -v is given.
func (f *Factory) Debugf(format string, args ...any) {
	if f.Global.Verbose > 0 {
		f.Printer().Debug(fmt.Sprintf(format, args...))
	}
}

// CommandLine is the kip command being run, each word quoted as a shell would need, so that a
// hint to run it again ("continue with …") works as written. It names lock holders and the
// workflows they start.
func (f *Factory) CommandLine() string {
	args := f.Args
	if args == nil {
		args = os.Args[1:]
	}
	return sshx.Command("kip", args...)
}
