-- gold.daily_revenue: one row per order day (orders.created_at, UTC).
--   orders            orders created that day, whatever their status
--   paid_orders       those whose current status is paid, shipped or delivered
--   cancelled_orders  those cancelled
--   unique_customers  distinct customers among the day's orders
--   revenue_cents     total_cents of the paid orders
--   avg_order_cents   their mean, rounded to the cent
--   p99_order_cents   their 99th percentile (interpolated: two decimals at
--                     most, rounded to them so the DOUBLE prints without
--                     the arithmetic's noise)
-- Deleted rows never count; quarantined changes never reach silver.
-- grain: order_date
-- touched by silver.orders: lakeflow_utc_date(created_at)
-- The day is computed once per order, in the subquery, by
-- lakeflow_utc_date: created_at::DATE, without the cost of ICU's calendar.
SELECT
    o.order_date,
    count(*) AS orders,
    count(*) FILTER (o.status IN ('paid', 'shipped', 'delivered')) AS paid_orders,
    count(*) FILTER (o.status = 'cancelled') AS cancelled_orders,
    count(DISTINCT o.customer_id) AS unique_customers,
    coalesce(sum(o.total_cents) FILTER (o.status IN ('paid', 'shipped', 'delivered')), 0)::BIGINT AS revenue_cents,
    round(avg(o.total_cents) FILTER (o.status IN ('paid', 'shipped', 'delivered')))::BIGINT AS avg_order_cents,
    round(quantile_cont(o.total_cents, 0.99) FILTER (o.status IN ('paid', 'shipped', 'delivered')), 2) AS p99_order_cents
FROM (SELECT lakeflow_utc_date(created_at) AS order_date, status, customer_id, total_cents FROM silver.orders WHERE NOT _deleted) o
WHERE o.order_date IN (SELECT grain FROM lakeflow_refresh)
GROUP BY o.order_date
