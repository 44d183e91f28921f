package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lakeflow/lakeflow/internal/fault"
)

// Workload drives the shop: each action is one transaction of a few row
// changes, as an application would make them.
type Workload struct {
	// Events is the number of row changes to make.
	Events int
	// Seed makes the workload repeatable.
	Seed uint64
	// ActionsPerTxn groups actions into one transaction (bulk loads).
	ActionsPerTxn int
	// Clean leaves out the actions that break contract rules.
	Clean bool
	// Rate, if set, paces the workload at about that many row changes
	// per second (a steady load); otherwise it goes as fast as it can.
	Rate int
}

// Done counts what a workload made.
type Done struct {
	Changes      int // row changes
	Transactions int
}

// Run makes w.Events row changes against the demo schema at dsn.
func (w Workload) Run(ctx context.Context, dsn string) (Done, error) {
	var done Done
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return done, fmt.Errorf("%w: demo: connect to source: %v", fault.ErrUnavailable, err)
	}
	defer conn.Close(context.Background())
	s := newShop(w.Seed)
	s.clean = w.Clean
	if err := s.load(ctx, conn); err != nil {
		return done, fmt.Errorf("demo: read current shop: %w", err)
	}
	per := max(w.ActionsPerTxn, 1)
	start := time.Now()
	for s.changes < w.Events {
		if w.Rate > 0 {
			// Ahead of the pace: wait until the changes made are due.
			due := start.Add(time.Duration(float64(s.changes) / float64(w.Rate) * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				select {
				case <-ctx.Done():
					return done, ctx.Err()
				case <-time.After(wait):
				}
			}
		}
		b := &pgx.Batch{}
		before := s.changes
		for i := 0; i < per && s.changes < w.Events; i++ {
			if w.Events-s.changes < 8 && len(s.customers) > 0 {
				s.updateCustomer(b) // one change at a time: end on the exact count
			} else {
				s.act(b)
			}
		}
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			if ctx.Err() != nil {
				return done, ctx.Err()
			}
			return done, fmt.Errorf("demo: workload transaction: %w", err)
		}
		done.Changes += s.changes - before
		done.Transactions++
	}
	return done, nil
}

type order struct {
	id     int64
	lines  int
	total  int64
	status string
}

// shop mirrors what the workload wrote, so it can pick rows to change
// without reading them back.
type shop struct {
	rng                                               *rand.Rand
	nextCustomer, nextProduct, nextOrder, nextPayment int64
	customers                                         []int64
	prices                                            map[int64]int64
	products                                          []int64
	byStatus                                          map[string][]*order
	changes                                           int
	clean                                             bool
}

var (
	countries = []string{"DE", "FR", "NL", "US", "GB", "ES", "IT", "PL", "SE", "JP"}
	segments  = []string{"consumer", "smb", "enterprise"}
	methods   = []string{"card", "paypal", "bank_transfer", "voucher"}
	category  = []string{"books", "games", "garden", "kitchen", "sports", "toys", "tools"}
	names     = []string{"Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Dennis", "Margaret", "Linus", "Radia"}
)

func newShop(seed uint64) *shop {
	return &shop{
		rng:          rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		nextCustomer: 1, nextProduct: 1, nextOrder: 1, nextPayment: 1,
		prices:   map[int64]int64{},
		byStatus: map[string][]*order{},
	}
}

// load picks up where earlier runs left the shop.
func (s *shop) load(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, "SELECT id FROM customers")
	if err != nil {
		return err
	}
	if s.customers, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		return err
	}
	rows, err = conn.Query(ctx, "SELECT id, price_cents FROM products WHERE active")
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, price int64
		if err := rows.Scan(&id, &price); err != nil {
			return err
		}
		s.products = append(s.products, id)
		s.prices[id] = price
	}
	rows, err = conn.Query(ctx, `SELECT o.id, o.status, o.total_cents, (SELECT count(*) FROM order_items i WHERE i.order_id = o.id) FROM orders o`)
	if err != nil {
		return err
	}
	for rows.Next() {
		o := &order{}
		if err := rows.Scan(&o.id, &o.status, &o.total, &o.lines); err != nil {
			return err
		}
		s.byStatus[o.status] = append(s.byStatus[o.status], o)
	}
	return conn.QueryRow(ctx, `SELECT
		(SELECT coalesce(max(id), 0) + 1 FROM customers), (SELECT coalesce(max(id), 0) + 1 FROM products),
		(SELECT coalesce(max(id), 0) + 1 FROM orders), (SELECT coalesce(max(id), 0) + 1 FROM payments)`).
		Scan(&s.nextCustomer, &s.nextProduct, &s.nextOrder, &s.nextPayment)
}

func (s *shop) pick(xs []string) string { return xs[s.rng.IntN(len(xs))] }

// take removes and returns a random order of a status, or nil.
func (s *shop) take(status string) *order {
	os := s.byStatus[status]
	if len(os) == 0 {
		return nil
	}
	i := s.rng.IntN(len(os))
	o := os[i]
	os[i] = os[len(os)-1]
	s.byStatus[status] = os[:len(os)-1]
	return o
}

func (s *shop) put(o *order, status string) {
	o.status = status
	s.byStatus[status] = append(s.byStatus[status], o)
}

// act appends one business action to b.
func (s *shop) act(b *pgx.Batch) {
	if len(s.customers) < 20 {
		s.newCustomer(b, false)
		return
	}
	if len(s.products) < 10 {
		s.newProduct(b)
		return
	}
	switch r := s.rng.IntN(100); {
	case r < 10:
		s.newCustomer(b, false)
	case r < 15:
		s.updateCustomer(b)
	case r < 45:
		s.newOrder(b)
	case r < 63:
		s.pay(b)
	case r < 74:
		s.advance(b, "paid", "shipped")
	case r < 82:
		s.advance(b, "shipped", "delivered")
	case r < 87:
		s.advance(b, "pending", "cancelled")
	case r < 89:
		s.refund(b)
	case r < 93:
		s.reprice(b)
	case r < 97:
		s.deleteCancelled(b)
	case r < 98:
		s.newProduct(b)
	case s.clean:
		s.newOrder(b)
	default:
		s.badRow(b)
	}
}

func (s *shop) newCustomer(b *pgx.Batch, badEmail bool) {
	id := s.nextCustomer
	s.nextCustomer++
	name := fmt.Sprintf("%s %c.", s.pick(names), 'A'+rune(s.rng.IntN(26)))
	email := fmt.Sprintf("customer%d@example.com", id)
	if badEmail {
		email = fmt.Sprintf("customer%d.example.com", id)
	}
	b.Queue(`INSERT INTO customers (id, email, name, country, segment) VALUES ($1, $2, $3, $4, $5)`,
		id, email, name, s.pick(countries), s.pick(segments))
	s.customers = append(s.customers, id)
	s.changes++
}

func (s *shop) updateCustomer(b *pgx.Batch) {
	id := s.customers[s.rng.IntN(len(s.customers))]
	if s.rng.IntN(2) == 0 {
		b.Queue(`UPDATE customers SET segment = $2, updated_at = now() WHERE id = $1`, id, s.pick(segments))
	} else {
		b.Queue(`UPDATE customers SET email = $2, updated_at = now() WHERE id = $1`, id, fmt.Sprintf("c%d.%d@example.org", id, s.rng.IntN(1000)))
	}
	s.changes++
}

func (s *shop) newProduct(b *pgx.Batch) {
	id := s.nextProduct
	s.nextProduct++
	price := int64(199 + s.rng.IntN(20000))
	b.Queue(`INSERT INTO products (id, sku, name, category, price_cents) VALUES ($1, $2, $3, $4, $5)`,
		id, fmt.Sprintf("SKU-%06d", id), fmt.Sprintf("Product %d", id), s.pick(category), price)
	s.products = append(s.products, id)
	s.prices[id] = price
	s.changes++
}

func (s *shop) newOrder(b *pgx.Batch) {
	o := &order{id: s.nextOrder, lines: 1 + s.rng.IntN(4)}
	s.nextOrder++
	customer := s.customers[s.rng.IntN(len(s.customers))]
	items := make([][]any, o.lines)
	for i := range items {
		p := s.products[s.rng.IntN(len(s.products))]
		qty := int64(1 + s.rng.IntN(3))
		o.total += qty * s.prices[p]
		items[i] = []any{o.id, i + 1, p, qty, s.prices[p]}
	}
	// Most orders are today's; one in four is booked up to two weeks back
	// (orders entered late, imports), so marts by order day see old days
	// change.
	daysBack := 0
	if s.rng.IntN(4) == 0 {
		daysBack = 1 + s.rng.IntN(13)
	}
	b.Queue(`INSERT INTO orders (id, customer_id, status, total_cents, currency, created_at) VALUES ($1, $2, 'pending', $3, 'EUR', now() - make_interval(days => $4))`,
		o.id, customer, o.total, daysBack)
	for _, it := range items {
		b.Queue(`INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price_cents) VALUES ($1, $2, $3, $4, $5)`, it...)
	}
	s.put(o, "pending")
	s.changes += 1 + o.lines
}

func (s *shop) pay(b *pgx.Batch) {
	o := s.take("pending")
	if o == nil {
		s.newOrder(b)
		return
	}
	s.payment(b, o.id, o.total, "captured")
	b.Queue(`UPDATE orders SET status = 'paid', updated_at = now() WHERE id = $1`, o.id)
	s.put(o, "paid")
	s.changes++
}

func (s *shop) payment(b *pgx.Batch, orderID, amount int64, status string) {
	b.Queue(`INSERT INTO payments (id, order_id, amount_cents, method, status) VALUES ($1, $2, $3, $4, $5)`,
		s.nextPayment, orderID, amount, s.pick(methods), status)
	s.nextPayment++
	s.changes++
}

func (s *shop) advance(b *pgx.Batch, from, to string) {
	o := s.take(from)
	if o == nil {
		s.newOrder(b)
		return
	}
	b.Queue(`UPDATE orders SET status = $2, updated_at = now() WHERE id = $1`, o.id, to)
	s.put(o, to)
	s.changes++
}

func (s *shop) refund(b *pgx.Batch) {
	o := s.take("delivered")
	if o == nil {
		if o = s.take("paid"); o == nil {
			s.newOrder(b)
			return
		}
	}
	s.payment(b, o.id, o.total, "refunded")
	b.Queue(`UPDATE orders SET status = 'refunded', updated_at = now() WHERE id = $1`, o.id)
	s.put(o, "refunded")
	s.changes++
}

func (s *shop) reprice(b *pgx.Batch) {
	id := s.products[s.rng.IntN(len(s.products))]
	if s.rng.IntN(10) == 0 && len(s.products) > 20 {
		b.Queue(`UPDATE products SET active = false WHERE id = $1`, id)
		for i, p := range s.products {
			if p == id {
				s.products = append(s.products[:i], s.products[i+1:]...)
				break
			}
		}
	} else {
		s.prices[id] = s.prices[id] * int64(90+s.rng.IntN(25)) / 100
		b.Queue(`UPDATE products SET price_cents = $2 WHERE id = $1`, id, s.prices[id])
	}
	s.changes++
}

// deleteCancelled removes a cancelled order and its lines, as a cleanup
// job would.
func (s *shop) deleteCancelled(b *pgx.Batch) {
	o := s.take("cancelled")
	if o == nil {
		s.advance(b, "pending", "cancelled")
		return
	}
	b.Queue(`DELETE FROM order_items WHERE order_id = $1`, o.id)
	b.Queue(`DELETE FROM orders WHERE id = $1`, o.id)
	s.changes += 1 + o.lines
}

// badRow writes a row that breaks one of the required contract rules.
func (s *shop) badRow(b *pgx.Batch) {
	switch s.rng.IntN(6) {
	case 0: // orders.total_non_negative
		o := &order{id: s.nextOrder, total: -int64(100 + s.rng.IntN(1000))}
		s.nextOrder++
		b.Queue(`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES ($1, $2, 'pending', $3, 'EUR')`,
			o.id, s.customers[0], o.total)
		s.put(o, "pending")
		s.changes++
	case 1: // orders.status_in_domain
		o := s.take("pending")
		if o == nil {
			s.newOrder(b)
			return
		}
		b.Queue(`UPDATE orders SET status = 'lost', updated_at = now() WHERE id = $1`, o.id)
		s.put(o, "lost")
		s.changes++
	case 2: // orders.customer_exists
		o := &order{id: s.nextOrder, total: 1000}
		s.nextOrder++
		b.Queue(`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES ($1, $2, 'pending', 1000, 'EUR')`,
			o.id, 900000000+s.rng.Int64N(1000000))
		s.put(o, "pending")
		s.changes++
	case 3: // order_items.quantity_positive
		o := &order{id: s.nextOrder, lines: 1}
		s.nextOrder++
		b.Queue(`INSERT INTO orders (id, customer_id, status, total_cents, currency) VALUES ($1, $2, 'pending', 0, 'EUR')`, o.id, s.customers[0])
		b.Queue(`INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price_cents) VALUES ($1, 1, $2, 0, 0)`, o.id, s.products[0])
		s.put(o, "pending")
		s.changes += 2
	case 4: // payments.amount_positive
		o := s.take("pending")
		if o == nil {
			s.newOrder(b)
			return
		}
		s.payment(b, o.id, -int64(1+s.rng.IntN(500)), "captured")
		s.put(o, "pending")
	default: // customers.email_format
		s.newCustomer(b, true)
	}
}
