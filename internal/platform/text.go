package platform

import (
	"fmt"
	"io"
	"strings"
	"time"

	"kipper.run/kip/internal/cli"
)

// glyphAbsent leads a chart the cluster does not run.
const glyphAbsent = "-"

// ConsoleAPIUnknown is what the report says when console-api has recorded no build.
const ConsoleAPIUnknown = "unknown (console-api has not recorded its build)"

// WriteText writes the report as people read it.
func (r *VersionsReport) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	r.writeKip(b)
	r.writeNodes(b)
	r.writeCharts(b)
	r.writeWorkloads(b)
	cli.WriteList(b, "Warnings", cli.GlyphWarn, r.Warnings)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *VersionsReport) writeKip(b *strings.Builder) {
	fmt.Fprintf(b, "kip: %s recorded on the App CRD, this kip %s\n", cli.OrNone(r.Kip.Recorded), cli.OrDash(r.Kip.Running))
	c := r.ConsoleAPI
	if !c.Recorded {
		fmt.Fprintf(b, "console-api: %s\n", ConsoleAPIUnknown)
		return
	}
	s := cli.OrDash(c.Version)
	if c.Commit != "" {
		s += " (commit " + c.Commit + ")"
	}
	if c.StartedAt != "" {
		s += ", recorded at startup " + c.StartedAt
	} else {
		s += ", recorded at startup"
	}
	if c.Pod != "" {
		s += " by pod " + c.Pod
	}
	fmt.Fprintf(b, "console-api: %s\n", s)
}

func (r *VersionsReport) writeNodes(b *strings.Builder) {
	var rows [][]string
	for _, n := range r.Nodes {
		rows = append(rows, []string{n.Name, n.Role, cli.OrDash(n.Kubernetes), cli.OrDash(n.ContainerRuntime), cli.OrDash(n.OSImage)})
	}
	cli.WriteTable(b, "Nodes", "none", []string{"NAME", "ROLE", "KUBERNETES", "RUNTIME", "OS"}, rows)
}

func (r *VersionsReport) writeCharts(b *strings.Builder) {
	var rows [][]string
	for _, c := range r.Charts {
		rows = append(rows, []string{chartGlyph(c.State) + " " + c.Component, c.Namespace + "/" + c.Release, c.Chart,
			c.Pinned, cli.OrDash(c.Installed), cli.OrDash(c.AppVersion), chartStatus(c)})
	}
	cli.WriteTable(b, "Charts", "none", []string{"  COMPONENT", "RELEASE", "CHART", "PINNED", "INSTALLED", "APP VERSION", "STATUS"}, rows)
	if len(r.Charts) == 0 {
		return
	}
	for _, c := range r.Charts {
		if c.State != ChartFailed {
			continue
		}
		fmt.Fprintf(b, "\n  %s Helm release %s in %s is failed at revision %d", cli.GlyphFail, c.Release, c.Namespace, c.Revision)
		if c.Installed != "" {
			fmt.Fprintf(b, " (chart %s)", c.Installed)
		}
		fmt.Fprintln(b)
		if c.Description != "" {
			fmt.Fprintf(b, "    helm: %s\n", c.Description)
		}
		if d := c.Deployed; d != nil {
			fmt.Fprintf(b, "    revision %d (chart %s) is the last deployed\n", d.Revision, cli.OrDash(d.Chart))
		}
		fmt.Fprintf(b, "    fix: drop the stale Helm release Secrets and let helm-controller install %s afresh:\n", c.Release)
		for _, cmd := range c.Fix {
			fmt.Fprintf(b, "      %s\n", cmd)
		}
	}
}

func chartGlyph(state string) string {
	switch state {
	case ChartOK:
		return cli.GlyphOK
	case ChartFailed, ChartError:
		return cli.GlyphFail
	case ChartNotInstalled:
		return glyphAbsent
	default:
		return cli.GlyphWarn
	}
}

// chartStatus is the STATUS column: Helm's status and revision, or why there is none.
func chartStatus(c ChartVersion) string {
	switch c.State {
	case ChartNotInstalled:
		return "not installed"
	case ChartNoRelease:
		return "no release yet"
	case ChartError:
		return "unreadable (see Warnings)"
	}
	s := fmt.Sprintf("%s (revision %d", c.Status, c.Revision)
	if c.Updated != nil {
		s += ", " + c.Updated.Format(time.DateTime) + " UTC"
	}
	s += ")"
	if c.State == ChartDiffers {
		s += ", not the pin"
	}
	return s
}

func (r *VersionsReport) writeWorkloads(b *strings.Builder) {
	var rows [][]string
	for _, w := range r.Workloads {
		if len(w.Images) == 0 {
			rows = append(rows, []string{w.Namespace, w.Kind, w.Name, "-", "-"})
		}
		for _, im := range w.Images {
			name := im.Container
			if im.Init {
				name += " (init)"
			}
			rows = append(rows, []string{w.Namespace, w.Kind, w.Name, name, im.Image})
		}
	}
	cli.WriteTable(b, "Images", "no Deployment, StatefulSet or DaemonSet in "+strings.Join(r.Namespaces, ", "),
		[]string{"NAMESPACE", "KIND", "NAME", "CONTAINER", "IMAGE"}, rows)
}
