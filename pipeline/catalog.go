package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/lakeflow/lakeflow/catalog"
	"github.com/lakeflow/lakeflow/internal/change"
	"github.com/lakeflow/lakeflow/internal/config"
	"github.com/lakeflow/lakeflow/internal/fault"
	"github.com/lakeflow/lakeflow/pipeline/kafka"
	"github.com/lakeflow/lakeflow/warehouse"
)

// operations describes lakeflow's own tables for the catalog: what each
// holds and when it changes.
var operations = map[string][2]string{
	"lakeflow.tables":         {"Every captured table: its Kafka topic, its silver table and its current schema.", "when a source schema changes"},
	"lakeflow.offsets":        {"Where the warehouse stands in Kafka: the next offset of each topic partition, moved by each batch in its own transaction.", "every batch"},
	"lakeflow.lake_files":     {"Every lake file: its table, commit day, Kafka span, positions, events, size and batch.", "every batch"},
	"lakeflow.compactions":    {"Each compaction of a table's commit day: the merged files it wrote, how many it replaced, when it was recorded and swapped into the lake.", "every compaction"},
	"lakeflow.batches":        {"Every committed batch of the last bookkeeping.batches (7 days by default): whether it ends at a watermark (consistent), the source position and commit time it leaves silver at, and its size.", "every batch"},
	"lakeflow.batch_hours":    {"Batches older than bookkeeping.batches, summarized per hour: how many, events, the batch numbers, and freshness (source commit to silver commit) mean and maximum.", "every hour"},
	"lakeflow.schema_history": {"Every version of each captured table's schema, with the position it took effect at.", "when a source schema changes"},
	"lakeflow.source_state":   {"The replication slot and snapshot lakeflow reads the source from.", "when the source's state changes"},
	"lakeflow.quarantine":     {"Changes that broke a contract rule: table, key, every rule failed, the action, the row and its position.", "every batch"},
	"lakeflow.dlq":            {"Events that cannot be applied (dead letters): topic, offset, stage, reason and raw payload.", "every batch"},
	"lakeflow.gold_marts":     {"Every gold mart: the hash of its SQL and when it was last refreshed.", "every refresh"},
	"lakeflow.gold_pending":   {"Partitions of gold marts that batches touched and that wait for their refresh: until the next published copy, or the mart's interval.", "every batch"},
	"lakeflow.runs":           {"Every lakeflow run of the last bookkeeping.runs (90 days by default): start, end, events, batches, lake files, quarantined and dead-lettered events, time per phase, how it ended.", "every run"},
	"lakeflow.checks":         {"The results of the data checks lakeflow run --follow runs on a schedule (check.interval), of the last bookkeeping.checks (30 days by default): failures, warnings and how many passed.", "every check.interval"},
}

// DeriveCatalog derives the catalog from what lakeflow knows: the lake's
// tables and their schemas, the contracts (owner, consumers,
// description, freshness), the gold marts (what they read, their header
// comment, their cadence) and the warehouse's tables as a pipeline
// creates them. It reads the lake only (its newest files) and runs beside
// lakeflow run.
func DeriveCatalog(ctx context.Context, cfg *config.Config, log *slog.Logger) (catalog.Catalog, error) {
	wh, loaded, err := lakeView(ctx, cfg, "", warehouse.View{History: true}, log)
	if err != nil {
		return nil, err
	}
	defer wh.Close()
	ls, err := wh.ReadLakeState(ctx)
	if err != nil {
		return nil, err
	}
	set, err := loaded()
	if err != nil {
		return nil, err
	}
	if len(ls.Schemas) == 0 {
		return nil, fmt.Errorf("%w: the lake at %s holds no events yet: run lakeflow run first", fault.ErrConfig, cfg.Lake.Dir)
	}
	// The tables a pipeline would create, empty: their shapes are what
	// the catalog documents.
	if err := wh.ApplyVersions(ctx, ls.Schemas, kafka.SchemaTopic(cfg.Kafka.TopicPrefix)); err != nil {
		return nil, err
	}
	if err := wh.SetContracts(ctx, set); err != nil {
		return nil, err
	}
	if err := setMarts(ctx, cfg, wh); err != nil {
		return nil, err
	}
	shapes, err := wh.Shapes(ctx)
	if err != nil {
		return nil, err
	}
	shapeOf := map[string][]catalog.Column{}
	for _, s := range shapes {
		shapeOf[s.Name] = columns(s)
	}
	var out catalog.Catalog
	judged, topics := []string{}, []string{}
	freshness := map[string]*catalog.Dataset{}
	for _, s := range ls.Newest() {
		id, name := s.Table.ID(), s.Table.Name
		base := catalog.Dataset{Cadence: "every batch", Source: catalog.SourcePrefix + id}
		if c := set[id]; c != nil {
			base.Owner, base.Consumers, base.Freshness = c.Owner, c.Consumers, c.Freshness
			if len(c.Rules) > 0 {
				judged = append(judged, "lake."+lakeDir(s))
			}
		}
		topic := catalog.TopicPrefix + s.Topic
		topics = append(topics, topic)
		lakeShape, ok, err := wh.LakeShape(ctx, s.Table)
		if err != nil {
			return nil, err
		}
		if ok {
			d := base
			d.Name, d.Kind, d.DerivedFrom, d.Columns = lakeShape.Name, catalog.Lake, []string{topic}, columns(lakeShape)
			d.Description = fmt.Sprintf("Every change of %s, once, as Parquet: lake/%s/date=<commit day>/…, never rewritten.", id, lakeDir(s))
			out = append(out, &d)
		}
		silver := base
		silver.Name, silver.Kind, silver.DerivedFrom = "silver."+name, catalog.Silver, []string{topic, "lake." + lakeDir(s)}
		silver.Description = fmt.Sprintf("%s as the source has it, one row per key (deleted rows kept, _deleted = true).", id)
		if c := set[id]; c != nil && c.Description != "" {
			silver.Description = c.Description
		}
		silver.Columns = shapeOf[silver.Name]
		out = append(out, &silver)
		freshness[name] = &silver
		if cols, ok := shapeOf["silver."+name+"_history"]; ok {
			h := base
			h.Name, h.Kind, h.DerivedFrom, h.Columns = "silver."+name+"_history", catalog.History, silver.DerivedFrom, cols
			h.Description = fmt.Sprintf("Every version of each %s row (SCD2): valid_from, valid_to and is_current from commit times.", id)
			out = append(out, &h)
		}
	}
	for _, m := range wh.Marts() {
		d := &catalog.Dataset{Name: "gold." + m.Name, Kind: catalog.Gold, Description: m.Description, Cadence: m.Cadence, Columns: shapeOf["gold."+m.Name]}
		for _, r := range m.Reads {
			d.DerivedFrom = append(d.DerivedFrom, "silver."+r)
			// A mart is as fresh as the tightest table it reads.
			if f := freshness[r]; f != nil && f.Freshness > 0 && (d.Freshness == 0 || f.Freshness < d.Freshness) {
				d.Freshness = f.Freshness
			}
		}
		out = append(out, d)
	}
	for _, s := range shapes {
		if !strings.HasPrefix(s.Name, "lakeflow.") {
			continue
		}
		op := operations[s.Name]
		d := &catalog.Dataset{Name: s.Name, Kind: catalog.Operations, Description: op[0], Cadence: op[1], Columns: columns(s)}
		switch s.Name {
		case "lakeflow.quarantine":
			d.DerivedFrom = judged
		case "lakeflow.dlq":
			d.DerivedFrom = topics
		}
		out = append(out, d)
	}
	return out, nil
}

func columns(s warehouse.TableShape) []catalog.Column {
	out := make([]catalog.Column, len(s.Columns))
	for i, c := range s.Columns {
		out[i] = catalog.Column{Name: c[0], Type: c[1]}
	}
	return out
}

// lakeDir is the lake directory of a table (as the warehouse names it).
func lakeDir(s warehouse.Schema) string { return change.SafeName(s.Table.Name) }

// InitCatalog writes a catalog entry, derived (DeriveCatalog), for each
// dataset that has none, and returns the files it wrote. An owner or
// description nothing derives is catalog.Placeholder.
func InitCatalog(ctx context.Context, cfg *config.Config, log *slog.Logger) ([]string, error) {
	have, err := catalog.Load(cfg.Catalog.Dir)
	if err != nil {
		return nil, err
	}
	derived, err := DeriveCatalog(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Catalog.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: create catalog.dir %s: %v", fault.ErrEnvironment, cfg.Catalog.Dir, err)
	}
	var written, kept []string
	defer func() {
		if len(kept) > 0 {
			log.Info("datasets that already have a catalog entry, left alone", "count", len(kept), "datasets", strings.Join(kept, ", "))
		}
	}()
	for _, d := range derived {
		if have.Find(d.Name) != nil {
			kept = append(kept, d.Name)
			continue
		}
		// What only a person can say is a placeholder lakeflow check
		// warns of, so an entry just written passes.
		if d.Owner == "" {
			d.Owner = catalog.Placeholder
		}
		if d.Description == "" {
			d.Description = catalog.Placeholder
		}
		path := filepath.Join(cfg.Catalog.Dir, catalog.FileName(d.Name))
		if err := os.WriteFile(path, d.Render(), 0o644); err != nil {
			return written, fmt.Errorf("%w: %v", fault.ErrEnvironment, err)
		}
		written = append(written, path)
	}
	return written, nil
}
