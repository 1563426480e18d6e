"""networkx builds a weighted graph and computes shortest paths and clustering coefficients;
the graph (adjacency dicts, float weights) and the results stay alive (the issue 13 case:
20,000 floats made at one line, charged elsewhere when free-list reuse was not re-attributed).
No PageRank: networkx computes it with scipy, which is not installed."""

import networkx as nx


def graph(nodes):
    g = nx.Graph()
    for i in range(nodes):
        # Weights computed here, one float per edge, at this workload's lines.
        g.add_edge(i, (i * 7 + 1) % nodes, weight=(i % 13) / 7.0 + 0.5)
        g.add_edge(i, (i * 3 + 2) % nodes, weight=(i % 5) / 3.0 + 0.25)
    return g


def setup():
    g = graph(30)
    nx.single_source_dijkstra_path_length(g, 0)
    nx.clustering(g)


def run():
    g = graph(2000)
    lengths = nx.single_source_dijkstra_path_length(g, 0)
    clustering = nx.clustering(g)
    return g, lengths, clustering
