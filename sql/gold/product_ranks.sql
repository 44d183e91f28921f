-- gold.product_ranks: per order day (orders.created_at, UTC) and product
-- category, each product sold that day in a paid, shipped or delivered
-- order: units, revenue (quantity × unit price) and its rank in the
-- category by revenue (1 = most; equal revenue, equal rank).
-- Deleted rows never count; quarantined changes never reach silver.
-- grain: order_date
-- touched by silver.orders: lakeflow_utc_date(created_at)
-- touched by silver.order_items: SELECT lakeflow_utc_date(o.created_at) FROM changed c JOIN silver.orders o ON o.id = c.order_id
-- A product's price does not count here (lines carry their own), so only a
-- product whose category, or existence, changed touches the days it sold.
-- Written as IN filters: mostly no product qualifies, and the joins from
-- it took 60-80 ms a batch on a grown warehouse, IN 3-4 ms:
-- touched by silver.products: SELECT lakeflow_utc_date(created_at) FROM silver.orders WHERE id IN (SELECT order_id FROM silver.order_items WHERE product_id IN (SELECT id FROM changed GROUP BY id HAVING count(DISTINCT (category, _deleted)) > 1))
-- The day is computed once per order, in the subquery, by
-- lakeflow_utc_date: created_at::DATE, without the cost of ICU's calendar.
SELECT
    order_date, category, product_id, units, revenue_cents,
    rank() OVER (PARTITION BY order_date, category ORDER BY revenue_cents DESC) AS rank
FROM (
    SELECT
        o.order_date,
        p.category,
        p.id AS product_id,
        sum(i.quantity)::BIGINT AS units,
        sum(i.quantity * i.unit_price_cents)::BIGINT AS revenue_cents
    FROM (SELECT id, lakeflow_utc_date(created_at) AS order_date FROM silver.orders
          WHERE NOT _deleted AND status IN ('paid', 'shipped', 'delivered')) o
    JOIN silver.order_items i ON i.order_id = o.id AND NOT i._deleted
    JOIN silver.products p ON p.id = i.product_id AND NOT p._deleted
    WHERE o.order_date IN (SELECT grain FROM lakeflow_refresh)
    GROUP BY o.order_date, p.category, p.id
)
