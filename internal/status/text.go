package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/prune"
)

// WriteText writes the report as people read it.
func (r *Report) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	r.writeCluster(b)
	r.writeNodes(b)
	r.writeHosts(b)
	r.writeStorage(b)
	r.writeComponents(b)
	r.writeOperations(b)
	r.writeKeptCopies(b)
	cli.WriteList(b, "Warnings", cli.GlyphWarn, r.Warnings)
	cli.WriteList(b, "Not looked at", glyphSkipped, r.Skipped)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) writeCluster(b *strings.Builder) {
	c := r.Cluster
	if !c.Recorded {
		fmt.Fprintln(b, "Cluster: no kip cluster record (kip did not install this cluster, or its record kipper.run/cluster is gone)")
		return
	}
	monitoring := "off"
	if m := c.Monitoring; m != nil {
		var on []string
		if m.Prometheus {
			on = append(on, "Prometheus")
		}
		if m.Loki {
			on = append(on, "Loki")
		}
		if len(on) > 0 {
			monitoring = strings.Join(on, " and ")
		}
	}
	backups := c.Backups
	if backups == "" {
		backups = "none"
	}
	fmt.Fprintf(b, "Cluster: %s storage, %s profile, monitoring %s, backups %s\n", c.Storage, c.Profile, monitoring, backups)
	fmt.Fprintf(b, "  server %s, pod network %s, installed by kip %s\n", cli.OrDash(c.Server), cli.OrDash(c.Network), cli.OrDash(c.KipVersion))
}

func (r *Report) writeNodes(b *strings.Builder) {
	var rows [][]string
	for _, n := range r.Nodes {
		st := n.Status
		if n.Unschedulable {
			st += ",SchedulingDisabled"
		}
		rows = append(rows, []string{n.Name, n.Role, st, cli.OrDash(n.K3sVersion), cli.OrDash(n.InternalIP), cli.OrDash(n.ExternalIP)})
	}
	cli.WriteTable(b, "Nodes", "none", []string{"NAME", "ROLE", "STATUS", "K3S", "INTERNAL-IP", "EXTERNAL-IP"}, rows)
}

// writeHosts says, host by host, whether its host checks passed; the checks that did not are
// under Warnings.
func (r *Report) writeHosts(b *strings.Builder) {
	fmt.Fprintln(b, "\nHost checks")
	if len(r.HostChecks) == 0 {
		fmt.Fprintln(b, "  none run (see Not looked at)")
		return
	}
	var nodes []string
	byNode := map[string][]Check{}
	for _, c := range r.HostChecks {
		if _, ok := byNode[c.Node]; !ok {
			nodes = append(nodes, c.Node)
		}
		byNode[c.Node] = append(byNode[c.Node], c)
	}
	for _, node := range nodes {
		glyph, passed := cli.GlyphOK, 0
		var wrong []string
		for _, c := range byNode[node] {
			switch c.Status {
			case StatusOK:
				passed++
			case StatusFail:
				glyph = cli.GlyphFail
				wrong = append(wrong, c.Name)
			case StatusWarn:
				if glyph != cli.GlyphFail {
					glyph = cli.GlyphWarn
				}
				wrong = append(wrong, c.Name)
			}
		}
		if len(wrong) == 0 {
			fmt.Fprintf(b, "  %s %s: %d %s passed\n", glyph, node, passed, plural(passed, "check"))
			continue
		}
		fmt.Fprintf(b, "  %s %s: %s not right (see Warnings), %d passed\n", glyph, node, strings.Join(wrong, ", "), passed)
	}
}

func (r *Report) writeStorage(b *strings.Builder) {
	fmt.Fprintln(b, "\nStorage")
	shown := false
	for _, n := range r.Nodes {
		s := n.Storage
		if s == nil {
			continue
		}
		shown = true
		fmt.Fprintf(b, "  %s\n", n.Name)
		for _, d := range s.Disks {
			fmt.Fprintf(b, "    %s\n", diskText(d))
		}
		if len(s.Volumes) > 0 {
			tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
			title := "LARGEST VOLUMES"
			if s.VolumeCount > len(s.Volumes) {
				title = fmt.Sprintf("LARGEST %d OF %d VOLUMES", len(s.Volumes), s.VolumeCount)
			}
			fmt.Fprintf(tw, "    %s\tCLAIM\tSTORAGE\tUSED\tSIZE\n", title)
			for _, v := range s.Volumes {
				claim := "-"
				if v.Claim != "" {
					claim = v.Namespace + "/" + v.Claim
				}
				if v.Orphaned {
					claim += " (no PersistentVolume: a kept copy or a leftover)"
				}
				used, size := "-", "-"
				if v.UsedBytes != nil {
					used = cli.FormatBytes(*v.UsedBytes)
				}
				if v.SizeBytes > 0 {
					size = cli.FormatBytes(v.SizeBytes)
				}
				fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", v.Name, claim, v.Storage, used, size)
			}
			tw.Flush()
		} else {
			fmt.Fprintln(b, "    no volumes")
		}
		if s.Low {
			fmt.Fprintf(b, "    %s %s\n", cli.GlyphWarn, s.Warning)
		}
	}
	if !shown {
		fmt.Fprint(b, "  nothing known")
		if len(r.Skipped) > 0 {
			fmt.Fprint(b, " (see Not looked at)")
		}
		fmt.Fprintln(b)
	}
}

func diskText(d Disk) string {
	if d.Name == "" {
		return fmt.Sprintf("%s free of %s on %s", cli.FormatBytes(d.FreeBytes), cli.FormatBytes(d.TotalBytes), d.Path)
	}
	s := fmt.Sprintf("Longhorn disk %s (%s): %s available of %s", d.Name, d.Path, cli.FormatBytes(d.FreeBytes), cli.FormatBytes(d.TotalBytes))
	if d.SchedulableBytes != nil {
		s += fmt.Sprintf(", %s schedulable", cli.FormatBytes(*d.SchedulableBytes))
	}
	if d.Eligible != nil && !*d.Eligible {
		s += ", not eligible for scheduling"
	}
	return s
}

func (r *Report) writeComponents(b *strings.Builder) {
	fmt.Fprintln(b, "\nComponents")
	if len(r.Components) == 0 {
		fmt.Fprintln(b, "  none known")
		return
	}
	for _, c := range r.Components {
		switch {
		case c.Ready:
			fmt.Fprintf(b, "  %s %s\n", cli.GlyphOK, c.Name)
		case c.Error != "":
			fmt.Fprintf(b, "  %s %s: %s\n", cli.GlyphFail, c.Name, c.Error)
		default:
			fmt.Fprintf(b, "  %s %s: %s\n", cli.GlyphFail, c.Name, cli.OrDash(c.Pending))
		}
	}
}

func (r *Report) writeOperations(b *strings.Builder) {
	var moves, ops []Operation
	for _, op := range r.Operations {
		if op.Kind == KindMoveToLonghorn {
			moves = append(moves, op)
		} else {
			ops = append(ops, op)
		}
	}
	fmt.Fprintln(b, "\nUnfinished kip operations")
	writeOps(b, ops)
	if r.Cluster.Storage == cluster.StorageLonghorn || len(moves) > 0 {
		fmt.Fprintln(b, "\nMoves to Longhorn not finished")
		writeOps(b, moves)
	}
}

func writeOps(b *strings.Builder, ops []Operation) {
	if len(ops) == 0 {
		fmt.Fprintln(b, "  none")
		return
	}
	for _, op := range ops {
		fmt.Fprintf(b, "  %s %s: %s", cli.GlyphWarn, op.Workflow, op.Status)
		if op.Step != "" {
			fmt.Fprintf(b, " at step %s", op.Step)
		}
		fmt.Fprintf(b, ", started %s by %s\n", op.StartedAt.Local().Format(time.DateTime), op.StartedBy)
		if op.Error != "" {
			fmt.Fprintf(b, "    error: %s\n", op.Error)
		}
		if op.Resume != "" {
			fmt.Fprintf(b, "    continue it: %s\n", op.Resume)
		}
	}
}

// writeKeptCopies lists the local copies moves kept, the space they use, and why each is kept;
// then the services stranded by a missing volume.
func (r *Report) writeKeptCopies(b *strings.Builder) {
	if len(r.KeptCopies) > 0 {
		total := ""
		if r.KeptCopiesBytes > 0 {
			total = ", " + cli.FormatBytes(r.KeptCopiesBytes)
		}
		fmt.Fprintf(b, "\nLocal copies kept after moves to Longhorn (%d%s)\n", len(r.KeptCopies), total)
		for _, c := range r.KeptCopies {
			glyph := cli.GlyphWarn
			if c.Deletable(prune.Waivers{}) {
				glyph = cli.GlyphOK
			}
			fmt.Fprintf(b, "  %s %s\n", glyph, prune.Line(c))
			switch {
			case c.Kind == prune.KindOrphan:
				fmt.Fprintln(b, "    its service and data claim are both gone: 'kip cluster storage prune' deletes it")
			case c.DeleteStarted:
				fmt.Fprintln(b, "    a prune was deleting it and was interrupted: 'kip cluster storage prune' finishes it if the deletion began, and otherwise checks it again")
			case len(c.Holds) == 0:
				fmt.Fprintln(b, "    no longer needed: 'kip cluster storage prune' deletes it")
			}
			for _, h := range c.Holds {
				fmt.Fprintf(b, "    kept: %s\n", h.Reason)
			}
		}
	}
	if len(r.Stranded) > 0 {
		fmt.Fprintln(b, "\nServices stranded by a missing volume")
		for _, s := range r.Stranded {
			fmt.Fprintf(b, "  %s %s: %s\n", cli.GlyphFail, s.Service, s.Reason)
		}
	}
	if len(r.CopiesUnset) > 0 {
		fmt.Fprintln(b, "\nServices whose copies are unset (Kipper leaves their storage as it is)")
		for _, c := range r.CopiesUnset {
			fmt.Fprintf(b, "  %s: copies kept %d; record them with '%s'\n", c.Service, c.Kept, c.Record)
		}
	}
}
