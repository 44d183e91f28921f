-- gold.customer_ltv: per customer with at least one paid, shipped or
-- delivered order: the first and last day of such an order (created_at,
-- UTC), their number, their total_cents summed (lifetime revenue) and its
-- mean per order, rounded to the cent.
-- Deleted rows never count (a deleted customer has no row); quarantined
-- changes never reach silver.
-- grain: customer_id
-- touched by silver.orders: customer_id
-- touched by silver.customers: id
SELECT
    c.id AS customer_id,
    lakeflow_utc_date(min(o.created_at)) AS first_order_date,
    lakeflow_utc_date(max(o.created_at)) AS last_order_date,
    count(*) AS orders,
    sum(o.total_cents)::BIGINT AS lifetime_revenue_cents,
    round(avg(o.total_cents))::BIGINT AS avg_order_cents
FROM silver.customers c
JOIN silver.orders o ON o.customer_id = c.id AND NOT o._deleted AND o.status IN ('paid', 'shipped', 'delivered')
WHERE NOT c._deleted
  AND c.id IN (SELECT grain FROM lakeflow_refresh)
GROUP BY c.id
