// js-libp2p 2.10's peer store (it-queue via mortice) calls Promise.withResolvers, which
// Node 20 lacks (Node >= 22 has it). Imported before anything of libp2p.
Promise.withResolvers ??= () => {
  let resolve, reject
  const promise = new Promise((resolve_, reject_) => { resolve = resolve_; reject = reject_ })
  return { promise, resolve, reject }
}
