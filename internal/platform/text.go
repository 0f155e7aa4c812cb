package platform

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
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
	fmt.Fprintf(b, "kip: %s recorded on the App CRD, this kip %s\n", orNone(r.Kip.Recorded), orDash(r.Kip.Running))
	c := r.ConsoleAPI
	if !c.Recorded {
		fmt.Fprintf(b, "console-api: %s\n", ConsoleAPIUnknown)
		return
	}
	s := orDash(c.Version)
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
	fmt.Fprintln(b, "\nNodes")
	if len(r.Nodes) == 0 {
		fmt.Fprintln(b, "  none")
		return
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tROLE\tKUBERNETES\tRUNTIME\tOS")
	for _, n := range r.Nodes {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, orDash(n.Kubernetes), orDash(n.ContainerRuntime), orDash(n.OSImage))
	}
	tw.Flush()
}

func (r *VersionsReport) writeCharts(b *strings.Builder) {
	fmt.Fprintln(b, "\nCharts")
	if len(r.Charts) == 0 {
		fmt.Fprintln(b, "  none")
		return
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    COMPONENT\tRELEASE\tCHART\tPINNED\tINSTALLED\tAPP VERSION\tSTATUS")
	for _, c := range r.Charts {
		fmt.Fprintf(tw, "  %s %s\t%s\t%s\t%s\t%s\t%s\t%s\n", chartGlyph(c.State), c.Component, c.Namespace+"/"+c.Release, c.Chart,
			c.Pinned, orDash(c.Installed), orDash(c.AppVersion), chartStatus(c))
	}
	tw.Flush()
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
			fmt.Fprintf(b, "    revision %d (chart %s) is the last deployed\n", d.Revision, orDash(d.Chart))
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
	fmt.Fprintln(b, "\nImages")
	if len(r.Workloads) == 0 {
		fmt.Fprintf(b, "  no Deployment, StatefulSet or DaemonSet in %s\n", strings.Join(r.Namespaces, ", "))
		return
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAMESPACE\tKIND\tNAME\tCONTAINER\tIMAGE")
	for _, w := range r.Workloads {
		if len(w.Images) == 0 {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t-\t-\n", w.Namespace, w.Kind, w.Name)
		}
		for _, im := range w.Images {
			name := im.Container
			if im.Init {
				name += " (init)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", w.Namespace, w.Kind, w.Name, name, im.Image)
		}
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
